"""GPU discovery and pinning for a task (executor side); checks of spark.*.resource.gpu.* (driver side)."""

from __future__ import annotations

import os

from qwenspark.config import EngineConfig


def task_gpu_addresses() -> list[str]:
    """GPU addresses this task holds: TaskContext resources, else CUDA_VISIBLE_DEVICES, else none."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None:
        gpu = ctx.resources().get("gpu")
        if gpu is not None and gpu.addresses:
            return list(gpu.addresses)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [a for a in visible.split(",") if a] if visible else []


def pin_task_gpus(cfg: EngineConfig) -> tuple[EngineConfig, list[str]]:
    """Set CUDA_VISIBLE_DEVICES to the task's GPUs before torch/vllm load; size tensor parallelism to them."""
    addresses = task_gpu_addresses()
    if addresses:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(addresses)
    if cfg.tensor_parallel_size is None:
        cfg = cfg.model_copy(update={"tensor_parallel_size": max(len(addresses), 1)})
    return cfg, addresses
