"""The shared engine's socket (qwenspark.serve.shared) with a test engine behind the host: concurrent requests each
get their own answer, label first; a request given up in a service process is dropped by the engine; refusals and
failures reach the caller as the service's errors; a host that goes away fails what waits on it and says so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from qwenspark.engines.base import Message, Retry
from qwenspark.errors import EngineError, RequestError
from qwenspark.serve import shared
from qwenspark.serve.engine import EARLY_TOKENS, Partial, Step
from qwenspark.serve.shared import Host, SharedVllm
from tests.support.char_tokens import CharTokens


class CharPrompts(CharTokens):
    """Prompts of the char tokenizer: the prompt is the last message's text."""

    def prompt(self, conversation: Sequence[Message]) -> list[int]:
        return self.encode(conversation[-1]["content"])

    def partial(self, step: Step) -> Partial:
        from qwenspark.engines.base import Completion

        text = self.decode(step.ids)
        return Partial(text, None, Completion(text, step.finish_reason, step.tokens_in, len(step.ids))
                       if step.finished else None)


class FakeEngine:
    """Answers "positive\\n" + the prompt reversed, a token per 5 ms; REFUSE is refused, FAIL fails; records what
    it started, finished and had cancelled (the records the assertions read, not the host's)."""

    model_name, tokenizer_path = "test", "unused"

    def __init__(self) -> None:
        self.running = self.most_running = 0
        self.started: list[str] = []
        self.finished: list[str] = []
        self.cancelled: list[str] = []

    async def steps(self, ids: list[int], lang: str | None, retry: Retry | None = None,
                    pin: str | None = None) -> AsyncIterator[Step]:
        prompt = "".join(map(chr, ids))
        self.started.append(prompt)
        if prompt == "REFUSE":
            raise RequestError("prompt longer than the context")
        if prompt == "FAIL":
            raise EngineError("vllm: EngineDeadError")
        answer = [ord(c) for c in "positive\n" + prompt[::-1]]
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            for n in range(1, len(answer) + 1):
                await asyncio.sleep(0.005)
                if n <= EARLY_TOKENS:
                    yield Step(answer[:n])
            self.finished.append(prompt)
            yield Step(answer, finish_reason="stop", tokens_in=len(ids), finished=True)
        except asyncio.CancelledError:
            self.cancelled.append(prompt)
            raise
        finally:
            self.running -= 1


@asynccontextmanager
async def _pair(tmp_path: Path, engine: FakeEngine | list[FakeEngine],
                lost: list[bool] | None = None) -> AsyncIterator[tuple[Host, SharedVllm]]:
    """A host serving engine (or engines) and one client connected to it, both closed at the end."""
    host = Host(engine if isinstance(engine, list) else [engine], tmp_path / "engine.sock")  # type: ignore[arg-type]
    await host.start()
    reader, writer = await asyncio.open_unix_connection(str(host.path))
    hello = await shared._read(reader)
    assert hello == {"model": "test", "tokenizer": "unused", "engines": len(host.engines)}
    client = SharedVllm(CharPrompts(), hello["model"], reader, writer,  # type: ignore[arg-type]
                        (lambda: lost.append(True)) if lost is not None else None)
    try:
        yield host, client
    finally:
        await client.close()
        await host.stop()


def _conversation(text: str) -> list[Message]:
    return [{"role": "user", "content": text}]


async def _answer(client: SharedVllm, text: str) -> list[Partial]:
    return [part async for part in client.stream(_conversation(text), "en")]


def test_concurrent_requests_each_get_their_own_answer_label_first(tmp_path: Path) -> None:
    async def go() -> None:
        engine = FakeEngine()
        async with _pair(tmp_path, engine) as (host, client):
            texts = [f"review number {i}" for i in range(30)]
            answers = await asyncio.gather(*(_answer(client, text) for text in texts))
            for text, parts in zip(texts, answers, strict=True):
                assert parts[-1].done is not None and parts[-1].done.text == "positive\n" + text[::-1]
                assert parts[-1].done.tokens_in == len(text)
                assert [p.done for p in parts[:-1]] == [None] * (len(parts) - 1)
                assert any(p.text == "positive\n" for p in parts[:-1])  # the label line before the rest
            assert sorted(engine.finished) == sorted(texts) and host.served == 30

    asyncio.run(go())


def test_a_request_given_up_by_its_service_process_is_dropped_by_the_engine(tmp_path: Path) -> None:
    async def go() -> None:
        engine = FakeEngine()
        async with _pair(tmp_path, engine) as (_host, client):
            slow = "x" * 400  # 2 s of answer at 5 ms a token
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(_answer(client, slow), 0.2)
            for _ in range(100):
                if engine.cancelled:
                    break
                await asyncio.sleep(0.01)
            assert engine.cancelled == [slow] and engine.finished == []
            assert (await _answer(client, "still serving"))[-1].done is not None

    asyncio.run(go())


def test_refusals_and_failures_reach_the_caller_as_the_services_errors(tmp_path: Path) -> None:
    async def go() -> None:
        engine = FakeEngine()
        async with _pair(tmp_path, engine) as (_host, client):
            with pytest.raises(RequestError, match="longer than the context"):
                await _answer(client, "REFUSE")
            with pytest.raises(EngineError, match="EngineDeadError"):
                await _answer(client, "FAIL")
            assert (await _answer(client, "fine"))[-1].done is not None

    asyncio.run(go())


def test_a_host_that_goes_away_fails_what_waits_and_reports_the_loss(tmp_path: Path) -> None:
    async def go() -> None:
        engine, lost = FakeEngine(), []
        async with _pair(tmp_path, engine, lost) as (host, client):
            waiting = asyncio.create_task(_answer(client, "y" * 400))
            await asyncio.sleep(0.1)
            await host.stop()  # the server and its connections closed: for a client, the host is gone
            with pytest.raises(EngineError, match="went away"):
                await waiting
            assert lost == [True]
            with pytest.raises(EngineError, match="went away"):
                await _answer(client, "after")

    asyncio.run(go())


def test_a_client_sending_garbage_is_dropped_and_the_others_go_on(tmp_path: Path) -> None:
    async def go() -> None:
        engine = FakeEngine()
        async with _pair(tmp_path, engine) as (host, client):
            for garbage in (shared._LENGTH.pack(1 << 31), shared._LENGTH.pack(5) + b"{nope"):
                reader, writer = await asyncio.open_unix_connection(str(host.path))
                await shared._read(reader)  # the hello
                writer.write(garbage)
                assert await reader.read() == b""  # closed by the host
                writer.close()
            assert (await _answer(client, "still serving"))[-1].done is not None

    asyncio.run(go())


def test_several_engines_share_the_requests_each_taking_the_next_when_it_has_fewest(tmp_path: Path) -> None:
    # serve.engines 3: 31 concurrent requests spread 11/10/10 (the fewest in progress, ties in turn); answers as with
    # one engine; the host's count of requests in progress is back to 0 for each, cancelled ones included.
    async def go() -> None:
        engines = [FakeEngine() for _ in range(3)]
        async with _pair(tmp_path, engines) as (host, client):
            texts = [f"review number {i}" for i in range(31)]
            answers = await asyncio.gather(*(_answer(client, text) for text in texts))
            for text, parts in zip(texts, answers, strict=True):
                assert parts[-1].done is not None and parts[-1].done.text == "positive\n" + text[::-1]
            assert sorted(len(e.finished) for e in engines) == [10, 10, 11]
            assert sorted(t for e in engines for t in e.finished) == sorted(texts)
            assert [e.most_running for e in engines] == [len(e.finished) for e in engines]  # all at once
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(_answer(client, "x" * 400), 0.2)
            for _ in range(100):
                if any(e.cancelled for e in engines):
                    break
                await asyncio.sleep(0.01)
            assert sum(len(e.cancelled) for e in engines) == 1 and host.in_progress == [0, 0, 0]
            # One after another, each request finds every engine idle: they take turns.
            for i in range(3):
                await _answer(client, f"alone {i}")
            assert all(any(t.startswith("alone") for t in e.finished) for e in engines)

    asyncio.run(go())


def test_a_host_with_several_engines_is_dead_when_any_engine_is() -> None:
    class Engine:
        def __init__(self, alive: bool) -> None:
            self._alive = alive

        def alive(self) -> bool:
            return self._alive

    assert Host([Engine(True), Engine(True)], Path("unused")).alive()  # type: ignore[list-item]
    assert not Host([Engine(True), Engine(False)], Path("unused")).alive()  # type: ignore[list-item]
    with pytest.raises(ValueError):
        Host([], Path("unused"))
