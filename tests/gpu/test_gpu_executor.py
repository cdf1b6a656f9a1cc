"""On a GPU: the executor function with vLLM on a Qwen-shaped dummy model (skipped where there is no GPU).

`python -m pytest -q tests/gpu` on a GPU machine with the `gpu` extra; the tokenizer comes from the tiny
test model's folder, or from $QWENSPARK_GPU_TOKENIZER. The throughput figures come from
bench/executor_throughput.py.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

pytestmark = pytest.mark.gpu


def _cuda() -> bool:
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _cuda(), reason="needs an NVIDIA GPU and the CUDA build of vLLM")
def test_executor_on_gpu_keeps_contract_and_releases_memory(gpu_tokenizer: Path, bench: ModuleType) -> None:
    import torch

    from qwenspark.analyze import AnalyzeSpec, make_analyze_fn
    from qwenspark.config import EngineConfig
    from qwenspark.engines import cache
    from qwenspark.resources import pin_task_gpus

    model = bench.shaped_model("qwen3-0.6b", gpu_tokenizer, Path("/tmp/qwenspark-test-qwen3-0.6b"))
    free_before = torch.cuda.mem_get_info()[0]
    cfg, _ = pin_task_gpus(
        EngineConfig(model=str(model), batch_size=64, max_tokens=64, gpu_memory_utilization=0.5,
                     engine_kwargs={"load_format": "dummy"})
    )
    frames = bench.review_frames(300, 100)
    spec = AnalyzeSpec(engine=cfg, prompt_version="v1", max_review_tokens=768)
    out = pd.concat(list(make_analyze_fn(spec)(iter(frames))), ignore_index=True)
    assert out["review_id"].tolist() == list(range(300))
    # dummy weights often run out of tokens mid-JSON: that is a row error, never a missing row
    assert (out["error"].isna() != out["sentiment"].isna()).all()
    assert (out["tokens_out"] > 0).all()
    cache.clear()
    torch.cuda.empty_cache()
    assert torch.cuda.mem_get_info()[0] >= 0.95 * free_before, "engine close released the GPU memory"
