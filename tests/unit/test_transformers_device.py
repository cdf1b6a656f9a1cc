"""The transformers engine honours engine.device: it loads on the task's GPU on GPU nodes, never silently on CPU."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from qwenspark.config import load_config
from qwenspark.engines.transformers import _device
from qwenspark.errors import EngineError

ROOT = Path(__file__).resolve().parents[2]


def fake_torch(gpu: bool) -> object:
    return types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: gpu))


@pytest.mark.parametrize(
    ("device", "gpu", "expected"),
    [("auto", True, "cuda"), ("auto", False, "cpu"), ("cuda", True, "cuda"), ("cpu", True, "cpu")],
)
def test_device_choice(device: str, gpu: bool, expected: str) -> None:
    cfg = load_config(ROOT / "conf" / "local.yaml", [f"engine.device={device}", "engine.kind=transformers"])
    assert _device(fake_torch(gpu), cfg.engine) == expected


def test_cuda_without_a_gpu_fails_loudly() -> None:
    cfg = load_config(ROOT / "conf" / "local.yaml", ["engine.device=cuda", "engine.kind=transformers"])
    with pytest.raises(EngineError, match=r"engine\.device=cuda"):
        _device(fake_torch(False), cfg.engine)
