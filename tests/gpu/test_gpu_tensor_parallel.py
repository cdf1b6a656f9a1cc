"""On 2+ GPUs: a task that holds two GPUs runs its engine with tensor_parallel_size=2 (skipped elsewhere).

The executor derives tensor parallelism from the GPUs Spark gives the task (qwenspark.resources.pin_task_gpus).
Spark is not needed: TaskContext.get() is replaced by a task that holds GPUs 0 and 1, as a task of an
executor with spark.executor/task.resource.gpu.amount=2 would be.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pandas as pd
import pytest

pytestmark = pytest.mark.gpu


def _two_gpus() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    if shutil.which("nvidia-smi") is None:
        return False
    from qwenspark.resources import visible_gpu_count

    return (visible_gpu_count() or 0) >= 2


class _TaskHoldingGpus:
    """What TaskContext.get() returns inside a task given these GPU addresses."""

    def __init__(self, addresses: list[str]) -> None:
        self._gpu = SimpleNamespace(name="gpu", addresses=addresses)

    def resources(self) -> dict[str, SimpleNamespace]:
        return {"gpu": self._gpu}

    def partitionId(self) -> int:  # Spark spells it so
        return 0


@pytest.mark.skipif(not _two_gpus(), reason="needs 2 NVIDIA GPUs and the CUDA build of vLLM")
def test_task_holding_two_gpus_runs_engine_tensor_parallel(
    gpu_tokenizer: Path, bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyspark
    import torch

    from qwenspark.analyze import AnalyzeSpec, make_analyze_fn
    from qwenspark.config import EngineConfig
    from qwenspark.engines import cache
    from qwenspark.resources import pin_task_gpus

    cache.clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # restored after the test
    task = _TaskHoldingGpus(["0", "1"])
    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: task))
    free_before = [torch.cuda.mem_get_info(i)[0] for i in range(2)]

    model = bench.shaped_model("qwen3-0.6b", gpu_tokenizer, Path("/tmp/qwenspark-test-qwen3-0.6b"))
    cfg = EngineConfig(model=str(model), batch_size=32, max_tokens=32, gpu_memory_utilization=0.5,
                       engine_kwargs={"load_format": "dummy"})
    assert cfg.tensor_parallel_size is None  # derived from the task's GPUs
    spec = AnalyzeSpec(engine=cfg, prompt_version="v1", max_review_tokens=768)
    out = pd.concat(list(make_analyze_fn(spec)(iter(bench.review_frames(200, 100)))), ignore_index=True)

    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    pinned, gpus = pin_task_gpus(cfg)
    assert gpus == ["0", "1"] and pinned.tensor_parallel_size == 2
    engine, loaded_now = cache.get_engine(pinned)
    assert not loaded_now, "the executor path loaded the engine of exactly this (TP=2) config"
    assert engine.vllm_config.parallel_config.tensor_parallel_size == 2  # type: ignore[attr-defined]
    used = [free_before[i] - torch.cuda.mem_get_info(i)[0] for i in range(2)]
    assert min(used) > 10 * 2**30, f"both GPUs hold a share of the engine, used {used}"

    assert out["review_id"].tolist() == list(range(200))
    assert (out["error"].isna() != out["sentiment"].isna()).all()
    assert (out["tokens_out"] > 0).all()

    cache.clear()
    torch.cuda.empty_cache()
    free_after = [torch.cuda.mem_get_info(i)[0] for i in range(2)]
    assert all(a >= 0.95 * b for a, b in zip(free_after, free_before, strict=True)), (free_before, free_after)
