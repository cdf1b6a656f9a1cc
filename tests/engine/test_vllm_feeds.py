"""The job's vLLM engine with its engine core in a process of its own (as on GPU clusters), fed through AsyncLLM's
streams on the tiny random Qwen3: the executor's continuous feed gets one valid row per review in order, a request
vLLM refuses is that row's error, aborted requests leave nothing behind, and a dead engine core fails the task."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import psutil
import pytest

from qwenspark.analyze import AnalyzeSpec, make_analyze_fn
from qwenspark.config import EngineConfig
from qwenspark.engines import build_engine, cache
from qwenspark.engines.vllm import VllmEngine
from qwenspark.engines.vllm_feeds import inspect_here
from qwenspark.errors import EngineError
from qwenspark.prompts import get_template
from qwenspark.schemas import CLEAN_SCHEMA
from tests.conftest import SAMPLE_REVIEWS

pytestmark = pytest.mark.engine


def _frame(texts: list[str], langs: list[str], first_id: int) -> pd.DataFrame:
    return pd.DataFrame(
        {"review_id": range(first_id, first_id + len(texts)), "hotel_id": "h", "created_at": None, "lang": langs,
         "text": texts, "input_key": "k", "clean_error": None},
        columns=CLEAN_SCHEMA.fieldNames(),
    )


def _wait(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_engine_core_in_its_own_process_through_async_streams(tiny_model: Path) -> None:
    cfg = EngineConfig(kind="vllm", model=str(tiny_model), max_tokens=384, max_model_len=2048, enforce_eager=True,
                       batch_size=4, max_in_flight=6,
                       env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1"})
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = build_engine(cfg)
    assert isinstance(engine, VllmEngine)
    try:
        cores = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        assert cores, "the engine core should run in a process of its own"
        assert type(engine._feed).__name__ == "EventLoop"
        # vllm.LLM's batch limits (offline usage context), not the engine classes' smaller default of 128 sequences.
        assert engine.vllm_config.scheduler_config.max_num_seqs == 256

        # Requests dropped half way leave nothing that a later call could take for its own.
        template = get_template("v1")
        llm = engine._feed._llm  # type: ignore[attr-defined]
        dropped = [engine.submit(template.messages(t, g), g) for t, g in SAMPLE_REVIEWS[:3]]
        _wait(lambda: llm.get_num_unfinished_requests() == 3)  # vLLM's own count: all three are decoding
        engine.abort(dropped)
        _wait(lambda: llm.get_num_unfinished_requests() == 0)
        time.sleep(0.5)
        assert engine._feed._done.empty(), "an aborted request still delivered an answer"  # type: ignore[attr-defined]

        # The executor function as mapInPandas calls it: 2 frames, continuous feed, one row far too long for the
        # context (vLLM refuses it once queued: that row's error, the others answered).
        texts = [t for t, _ in SAMPLE_REVIEWS] * 2
        langs = [g for _, g in SAMPLE_REVIEWS] * 2
        texts[5] = "The room was fine. " * 500
        spec = AnalyzeSpec(engine=cfg, prompt_version="v1", max_review_tokens=4000)
        frames = [_frame(texts[:7], langs[:7], 0), _frame(texts[7:], langs[7:], 7)]
        out = pd.concat(list(make_analyze_fn(spec, engine_factory=lambda _cfg: engine)(iter(frames))),
                        ignore_index=True)
        assert out["review_id"].tolist() == list(range(len(texts)))
        refused = out.loc[5, "error"]
        assert isinstance(refused, str) and "engine refused the request" in refused, refused
        others = out.drop(index=5)
        assert others["error"].isna().all(), others["error"].tolist()
        assert others["sentiment"].notna().all() and (others["tokens_in"] > 300).all()

        # The engine core dies (an OOM kill, a crash): the next call fails, it does not store error rows.
        for core in cores:
            os.kill(core.pid, signal.SIGKILL)
        with pytest.raises(EngineError):
            engine.generate([template.messages("Clean room.", "en")], ["en"])
    finally:
        engine.close()
        cache.clear()  # make_analyze_fn cached it


def test_engine_core_in_this_process_inspects_the_model_class_here(tiny_model: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty vLLM cache, vLLM would inspect the model's class in a fresh Python (8.7 s of a first load on this
    CPU); with the engine core in this process (the job's and the service's on CPU) it is inspected here, and nothing
    is started."""
    from vllm import ModelRegistry
    from vllm.model_executor.models import registry

    arch = json.loads((tiny_model / "config.json").read_text())["architectures"][0]
    # As vLLM registers its own models before any engine loads (earlier tests' engines replaced the entry); put back
    # after the test.
    module, name = registry._VLLM_MODELS[arch]
    lazy = registry._LazyRegisteredModel(module_name=registry._resolve_module_name(module), class_name=name)
    monkeypatch.setitem(ModelRegistry.models, arch, lazy)

    def subprocess_run(fn: Callable[[], object]) -> object:
        raise AssertionError("inspected in a subprocess")

    monkeypatch.setattr(registry, "_run_in_subprocess", subprocess_run)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    with pytest.raises(AssertionError, match="subprocess"):  # what vLLM does by itself with an empty cache
        lazy.inspect_model_cls()

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # a core process of its own would inspect again
    inspect_here(str(tiny_model))
    assert ModelRegistry.models[arch] is lazy

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    inspect_here(str(tiny_model))
    info = ModelRegistry._try_inspect_model_cls(arch)
    assert info is not None and info.is_text_generation_model
    assert ModelRegistry.models[arch].load_model_cls() is lazy.load_model_cls()

    inspect_here(str(tmp_path))  # no config.json: left to vLLM, which says what is missing
    # A class that cannot be imported here is left to vLLM's inspection, which reports it.
    broken = registry._LazyRegisteredModel(module_name="qwenspark_no_such_module", class_name="NoSuchForCausalLM")
    monkeypatch.setitem(ModelRegistry.models, "NoSuchForCausalLM", broken)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchForCausalLM", "Unknown"]}))
    inspect_here(str(tmp_path))
    assert ModelRegistry.models["NoSuchForCausalLM"] is broken
