"""GPU discovery and pinning for a task (executor side); checks of spark.*.resource.gpu.* (driver side)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping

from qwenspark.config import EngineConfig, QwenSparkConfig
from qwenspark.errors import ConfigError

log = logging.getLogger(__name__)

EXECUTOR_GPU_AMOUNT = "spark.executor.resource.gpu.amount"
TASK_GPU_AMOUNT = "spark.task.resource.gpu.amount"
WORKER_REUSE = "spark.python.worker.reuse"

# Engines that load the model inside the Python worker: each one owns the GPUs its task was given.
# (An engine that calls a server, e.g. kind=openai, holds no GPU in the executor.)
IN_PROCESS_KINDS = frozenset({"vllm", "transformers"})


def task_gpu_addresses(device: str = "auto") -> list[str]:
    """GPU addresses this task may use, first answer wins.

    1. The task's Spark resources, `TaskContext.resources()["gpu"]` (standalone, YARN, Kubernetes with
       spark.task.resource.gpu.amount; the addresses are what the discovery script printed).
    2. CUDA_VISIBLE_DEVICES already set in the worker (a container runtime or a scheduler outside Spark
       isolated the GPUs; or an earlier task of this worker pinned them).
    3. Only for device="cuda": the partition id, modulo the GPUs nvidia-smi lists. That is local mode, where
       Spark offers no resources to tasks (a task that asks for some is never scheduled): like spark-rapids-ml,
       task i takes GPU i. On any other master check_gpu_conf refuses device=cuda without executor GPUs, so
       there step 1 answers first.

    device="cpu": none, whatever Spark assigned.
    """
    if device == "cpu":
        return []
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None:
        gpu = ctx.resources().get("gpu")
        if gpu is not None and gpu.addresses:
            return [str(a).strip() for a in gpu.addresses]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return [a.strip() for a in visible.split(",") if a.strip()]
    if device == "cuda" and ctx is not None:
        count = visible_gpu_count()
        partition = ctx.partitionId()
        address = str(partition % count if count else partition)
        log.warning(
            "engine.device=cuda and the task holds no Spark GPU resource: local mode, partition %d takes GPU %s",
            partition,
            address,
        )
        return [address]
    return []


def visible_gpu_count() -> int | None:
    """How many GPUs nvidia-smi lists on this host (None: no nvidia-smi, or it failed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return None
    return sum(1 for line in out.stdout.splitlines() if line.strip()) or None


def pin_task_gpus(cfg: EngineConfig) -> tuple[EngineConfig, list[str]]:
    """Set CUDA_VISIBLE_DEVICES to the task's GPUs before torch/vllm load; size tensor parallelism to them.

    Must run before anything in the worker imports torch or initialises CUDA: CUDA reads the variable once.
    Spark's addresses are host indices (nvidia-smi's), so overwriting an inherited CUDA_VISIBLE_DEVICES with
    them is right. device="cpu" hides every GPU from the engine.
    """
    addresses = task_gpu_addresses(cfg.device)
    if cfg.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif addresses:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(addresses)
    if cfg.tensor_parallel_size is None:
        cfg = cfg.model_copy(update={"tensor_parallel_size": max(len(addresses), 1)})
    return cfg, addresses


def driver_only(what: str = "this function") -> None:
    """Raise when called inside a Spark task: driver-side checks read the driver's conf, not a task's."""
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        raise RuntimeError(f"{what} must run on the Spark driver, not inside a Spark task")


def is_local_master(master: str) -> bool:
    """local, local[N], local[*], local[N,F]: one JVM, no executors (local-cluster[...] has real executors)."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def _amount(conf: Mapping[str, str], key: str) -> float:
    raw = str(conf.get(key, "0")).strip() or "0"
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number") from None


def check_gpu_conf(conf: Mapping[str, str], cfg: QwenSparkConfig) -> None:
    """Refuse Spark settings that would leave a GPU job without GPUs or put two engines on one GPU.

    conf: the driver's Spark settings (dict(sparkContext.getConf().getAll())).
    """
    driver_only("check_gpu_conf")
    engine = cfg.engine
    master = str(conf.get("spark.master", ""))
    local = is_local_master(master)

    if str(conf.get(WORKER_REUSE, "true")).strip().lower() != "true":
        raise ConfigError(f"{WORKER_REUSE}=false: every task would load the model again; set it to true")

    executor_gpus = _amount(conf, EXECUTOR_GPU_AMOUNT)
    task_gpus = _amount(conf, TASK_GPU_AMOUNT)
    if engine.kind not in IN_PROCESS_KINDS:
        if engine.device == "cuda":
            log.warning("engine.device=cuda has no effect with engine.kind=%s: the server holds the GPUs", engine.kind)
        return

    if local:
        # Measured with pyspark 4.3, local[2]: a stage whose tasks ask for a GPU stays at 0 running tasks
        # for ever, because local mode offers no resources. GPUs there come from the partition id instead.
        if task_gpus > 0:
            raise ConfigError(
                f"{TASK_GPU_AMOUNT}={task_gpus:g} with master {master}: local mode offers no resources, so the "
                f"tasks would never be scheduled; unset it (with engine.device=cuda task i uses GPU i)"
            )
        return

    if engine.device == "cuda" and executor_gpus <= 0:
        raise ConfigError(
            f"engine.device=cuda but {EXECUTOR_GPU_AMOUNT} is {'unset' if EXECUTOR_GPU_AMOUNT not in conf else '0'} "
            f"(master {master or 'unknown'}): executors would start without GPUs; set {EXECUTOR_GPU_AMOUNT}=1, "
            f"{TASK_GPU_AMOUNT}=1 and a discovery script (see conf/spark-defaults-gpu.conf)"
        )
    if executor_gpus <= 0:
        return
    if engine.device == "cpu":
        log.warning("%s=%g but engine.device=cpu: the executors' GPUs stay idle", EXECUTOR_GPU_AMOUNT, executor_gpus)
        return
    if task_gpus < 1 or not task_gpus.is_integer():
        if task_gpus <= 0:
            raise ConfigError(
                f"{TASK_GPU_AMOUNT} is unset but {EXECUTOR_GPU_AMOUNT}={executor_gpus:g}: tasks would hold no GPU "
                f"while each loads an engine; set {TASK_GPU_AMOUNT}={executor_gpus:g}"
            )
        raise ConfigError(
            f"{TASK_GPU_AMOUNT}={task_gpus:g} is fractional: several tasks would share a GPU and each load its own "
            f"engine (engine.kind={engine.kind}) on it; use a whole number, {TASK_GPU_AMOUNT}={executor_gpus:g}"
        )
    if task_gpus < executor_gpus:
        raise ConfigError(
            f"{TASK_GPU_AMOUNT}={task_gpus:g} < {EXECUTOR_GPU_AMOUNT}={executor_gpus:g}: two tasks of one executor "
            f"would load two engines (engine.kind={engine.kind}) on its GPUs; set {TASK_GPU_AMOUNT}="
            f"{executor_gpus:g} so that one task per executor holds them all"
        )
