"""Engines honour engine.device (the task's GPU, never silently the CPU) and pick a dtype the hardware runs natively."""

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


@pytest.mark.parametrize(
    ("flags", "on_gpu", "expected"),
    [
        ("fpu sse avx2 avx512f", False, "float32"),  # AVX2/AVX-512 without BF16: bf16 would be emulated
        ("fpu avx2 avx512f avx512_bf16", False, "bfloat16"),
        ("fpu avx2 amx_bf16", False, "bfloat16"),
        ("fpu avx2", True, "bfloat16"),  # GPUs do bf16
    ],
)
def test_auto_dtype_follows_the_hardware(flags: str, on_gpu: bool, expected: str) -> None:
    from qwenspark.engines.base import resolve_dtype

    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n"
    assert resolve_dtype("auto", on_gpu, cpuinfo) == expected
    assert resolve_dtype("float16", on_gpu, cpuinfo) == "float16"  # an explicit dtype is kept
