"""serve.workers with a custom engine: several service processes on one port, each with its own engine. Which
engine answered is read from the test engine's own records (one file per process), not from the service; the
supervisor stops them all."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    records = tmp_path / "records"
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "engine": {"kind": "custom", "factory": "tests.support.echo_engine:build", "model": "echo",
                   "engine_kwargs": {"record_dir": str(records), "seconds_per_token": 0.001}},
        "prompt": {"version": "v9"}, "serve": {"workers": 2},
    }))
    port = _port()
    server = subprocess.Popen([sys.executable, "-m", "qwenspark.cli", "serve", "--config", str(config), "--port",
                               str(port)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return server, port, records


def _loaded(records: Path) -> set[int]:
    lines = [json.loads(line) for f in records.glob("*.jsonl") for line in f.read_text().splitlines()]
    return {e["pid"] for e in lines if e["event"] == "load"}


def test_a_worker_that_dies_stops_the_others_and_the_service_fails(tmp_path: Path) -> None:
    server, _, records = _start(tmp_path)
    try:
        deadline = time.time() + 120
        while len(_loaded(records) if records.exists() else ()) < 2 and time.time() < deadline:
            assert server.poll() is None, "the service exited"
            time.sleep(0.5)
        first, second = sorted(_loaded(records))
        time.sleep(1)
        os.kill(first, signal.SIGKILL)
        rc = server.wait(timeout=90)
    finally:
        if server.poll() is None:
            server.kill()
    assert rc != 0, "a worker's death must end the service red"
    assert not Path(f"/proc/{second}").exists(), "the other worker was left running"


def test_two_workers_share_the_port_each_engine_answers_and_all_stop_together(tmp_path: Path) -> None:
    server, port, records = _start(tmp_path)
    try:
        deadline = time.time() + 120
        # each worker answers, and froze its loaded heap out of the collector's reach (serve_one): read back from
        # its /metrics
        frozen: dict[int, float] = {}
        while len(frozen) < 2 and time.time() < deadline:
            try:
                with httpx.Client(timeout=5) as fresh:  # a new connection each time, spread by the kernel
                    worker = fresh.get(f"http://127.0.0.1:{port}/healthz").json()["worker"]
                    text = fresh.get(f"http://127.0.0.1:{port}/metrics").text
            except httpx.HTTPError:
                assert server.poll() is None, "the service exited"
                time.sleep(0.5)
                continue
            found = re.search(r"^qwenspark_serve_gc_frozen_objects (\S+)$", text, re.MULTILINE)
            assert found is not None, text
            frozen[worker] = float(found.group(1))
        assert set(frozen) == {0, 1}
        assert min(frozen.values()) > 10_000, frozen
        for i in range(40):
            response = httpx.post(f"http://127.0.0.1:{port}/v1/analyze", json={"text": f"Dirty room {i}."},
                                  timeout=30)
            assert response.status_code == 200 and response.json()["results"][0]["sentiment"] == "negative"
        events = [json.loads(line) for f in records.glob("*.jsonl") for line in f.read_text().splitlines()]
        loads = {e["pid"] for e in events if e["event"] == "load"}
        calls = {e["pid"]: 0 for e in events if e["event"] == "load"}
        for e in events:
            if e["event"] == "call":
                calls[e["pid"]] += e["rows"]
        assert len(loads) == 2 and server.pid not in loads, loads
        assert sum(calls.values()) == 40 and all(n > 0 for n in calls.values()), calls  # each engine did work
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=90)
    assert rc == 0
    alive = [pid for pid in loads if Path(f"/proc/{pid}").exists()]
    assert not alive, f"workers left running: {alive}"


def test_workers_default_to_three_for_vllm_on_a_gpu_and_one_elsewhere(monkeypatch: Any) -> None:
    from qwenspark.config import validate_config
    from qwenspark.engines import vllm
    from qwenspark.serve.sizing import GPU_WORKERS, worker_count

    gpu = {"seen": True}
    monkeypatch.setattr(vllm, "on_gpu", lambda: gpu["seen"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))

    def count(kind: str, workers: int | None = None) -> int:
        serve = {} if workers is None else {"workers": workers}
        engine = {"kind": kind, "model": "m", "base_url": "http://127.0.0.1:8000/v1"} if kind == "openai" else {
            "kind": kind, "model": "m"}
        return worker_count(validate_config({"engine": engine, "serve": serve}))

    assert GPU_WORKERS == 3 and count("vllm") == 3
    assert count("vllm", 2) == 2 and count("vllm", 1) == 1  # what the user sets wins
    assert count("openai") == 1  # each worker would load its own engine
    gpu["seen"] = False
    assert count("vllm") == 1 and count("vllm", 4) == 4
    gpu["seen"] = True
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert count("vllm") == 1  # the engine core needs the cores


# Published config.json shapes (the keys model_parameters reads) and their models' published sizes.
_QWEN3_06B = {"hidden_size": 1024, "num_hidden_layers": 28, "intermediate_size": 3072, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True}
_QWEN25_05B = {"hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864, "num_attention_heads": 14,
               "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
_QWEN25_7B = {"hidden_size": 3584, "num_hidden_layers": 28, "intermediate_size": 18944, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}


@pytest.mark.parametrize(("shape", "billions"), [(_QWEN3_06B, 0.596), (_QWEN25_05B, 0.494), (_QWEN25_7B, 7.62)])
def test_a_models_parameters_are_counted_from_its_config(shape: dict[str, Any], billions: float,
                                                         tmp_path: Path) -> None:
    from qwenspark.serve.sizing import model_parameters

    (tmp_path / "config.json").write_text(json.dumps(shape))
    got = model_parameters(tmp_path)
    assert got is not None and abs(got / 1e9 - billions) < 0.01 * billions


@pytest.mark.parametrize("written", [None, "{not json", json.dumps({"hidden_size": 1024}), json.dumps([1]),
                                     json.dumps({**_QWEN3_06B, "num_experts": 128})])
def test_a_model_of_unknown_size_counts_as_none(written: str | None, tmp_path: Path) -> None:
    from qwenspark.serve.sizing import model_parameters

    if written is not None:
        (tmp_path / "config.json").write_text(written)
    assert model_parameters(tmp_path) is None


def test_engines_default_to_two_for_a_small_model_on_a_gpu_and_one_elsewhere(monkeypatch: Any,
                                                                            tmp_path: Path) -> None:
    from qwenspark.config import validate_config
    from qwenspark.engines import vllm
    from qwenspark.serve.sizing import SMALL_ENGINES, engine_count

    small, large, unknown = tmp_path / "small", tmp_path / "large", tmp_path / "unknown"
    for folder, shape in ((small, _QWEN3_06B), (large, _QWEN25_7B)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(shape))
    gpu = {"seen": True}
    monkeypatch.setattr(vllm, "on_gpu", lambda: gpu["seen"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))

    def count(model: Path, engines: int | None = None, kind: str = "vllm") -> int:
        serve = {} if engines is None else {"engines": engines}
        engine = {"kind": kind, "model": str(model)}
        if kind == "openai":
            engine["base_url"] = "http://127.0.0.1:8000/v1"
        return engine_count(validate_config({"engine": engine, "serve": serve}))

    assert SMALL_ENGINES == 2 and count(small) == 2
    assert count(large) == 1 and count(unknown) == 1
    assert count(small, 1) == 1 and count(large, 3) == 3  # what the user sets wins
    assert count(small, kind="openai") == 1
    gpu["seen"] = False
    assert count(small) == 1
    gpu["seen"] = True
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert count(small) == 1  # each engine core needs a core of its own


class _Loaded:
    """What EngineHost needs of a started engine (AsyncVllm's alive, close, model_name)."""

    model_name = "m"

    def alive(self) -> bool:
        return True

    async def close(self) -> None:
        pass


@pytest.mark.parametrize(("share", "each"), [(None, 0.45), (0.5, 0.25)])
def test_engines_on_one_gpu_each_ask_for_a_part_of_its_memory(share: float | None, each: float,
                                                               monkeypatch: Any) -> None:
    """With serve.engines 2 on a GPU each engine is started with half the service's memory share (unset: of vLLM's
    default 0.9, whose whole each asked for before, failing the second's start); read from what each start got."""
    import qwenspark.engines.vllm as vllm_engine
    from qwenspark.config import EngineConfig
    from qwenspark.serve import engine as serve_engine
    from qwenspark.serve.workers import EngineHost

    started: list[EngineConfig] = []

    async def start(cfg: EngineConfig) -> _Loaded:
        started.append(cfg)
        return _Loaded()

    monkeypatch.setattr(vllm_engine, "on_gpu", lambda: True)
    monkeypatch.setattr(vllm_engine, "apply_env", lambda cfg: None)
    monkeypatch.setattr(serve_engine.AsyncVllm, "start", staticmethod(start))
    host = EngineHost(EngineConfig(kind="vllm", model="m", gpu_memory_utilization=share), 2)
    try:
        assert host.start().exists()
    finally:
        host.stop()
    assert [cfg.gpu_memory_utilization for cfg in started] == [each, each]
