"""One vLLM engine shared by the service's processes (serve.workers with engine.kind vllm): its host in the supervisor,
a client in each service process, token ids each way over a Unix socket.

Why: one Python process per engine was the service's bound on a GPU (stop 32: 0.87-0.97 of a core at 100-200
requests/s while the engine core idled). The work per request that grows with the request rate (HTTP, the guard, the
token cap, the prompt's ids, the label head, parsing, decoding) now runs in N service processes; the host only hands
token ids to vLLM's AsyncLLM and its reports back (qwenspark.serve.engine.AsyncVllm.steps). With serve.engines > 1
the host holds that many engines (each its own vLLM engine core on the same GPU) and gives each request to the one
with the fewest in progress: a small model's engine core is bound by its own step loop's CPU, not by the GPU.

Frames are a 4-byte big-endian length and a JSON object. Client -> host: {"gen": id, "ids", "lang", "retry", "pin"}
and {"abort": id}; host -> client: the hello {"model", "tokenizer", "engines"} once, then {"id", "step": {...}} per
report and {"id", "refused": reason} (the engine refused that request: its row's error) or {"id", "failed": reason}
(the engine failed: 503). The socket lives in a fresh directory only this user can enter.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from qwenspark.engines.base import Message, Retry
from qwenspark.errors import EngineError, RequestError
from qwenspark.serve.engine import AsyncVllm, Partial, Prompts, Step

log = logging.getLogger("qwenspark.serve")

_LENGTH = struct.Struct("!I")
_LIMIT = 64 * 1024 * 1024  # a frame's bound: a prompt of max_model_len ids is far below it


def _frame(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":")).encode()
    return _LENGTH.pack(len(data)) + data


async def _read(reader: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if size > _LIMIT:
        raise EngineError(f"serve: a frame of {size} bytes on the shared engine's socket")
    message: dict[str, Any] = json.loads(await reader.readexactly(size))
    return message


def _forget(tasks: dict[int, asyncio.Task[None]], rid: int, _: asyncio.Task[None]) -> None:
    tasks.pop(rid, None)


class Host:
    """The shared engines' side: each request a task streaming its steps to the client that asked, on the engine with
    the fewest requests in progress (serve.engines); a request is aborted (vLLM drops it) when its client says so or
    goes away."""

    def __init__(self, engines: Sequence[AsyncVllm], path: Path) -> None:
        if not engines:
            raise ValueError("serve: a shared engine host needs an engine")
        self.engines, self.path = list(engines), path
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()
        self.served = 0  # requests handed to the engines (tests read it)
        self.in_progress = [0] * len(self.engines)  # per engine: what the next request's engine is chosen by
        self._turn = itertools.count()

    def _pick(self) -> int:
        """The engine with the fewest requests in progress; ties taken in turn, so idle engines share the work."""
        count = len(self.engines)
        start = next(self._turn) % count
        return min(((start + i) % count for i in range(count)), key=self.in_progress.__getitem__)

    def alive(self) -> bool:
        return all(engine.alive() for engine in self.engines)

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._client, path=str(self.path))

    async def stop(self) -> None:
        """Stop listening and close every client's connection (their requests are dropped)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._clients):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks: dict[int, asyncio.Task[None]] = {}
        self._clients.add(writer)
        writer.write(_frame({"model": self.engines[0].model_name, "tokenizer": self.engines[0].tokenizer_path,
                             "engines": len(self.engines)}))
        try:
            while True:
                message = await _read(reader)
                if "gen" in message:
                    rid = int(message["gen"])
                    task = tasks[rid] = asyncio.create_task(self._run(rid, message, writer))
                    task.add_done_callback(functools.partial(_forget, tasks, rid))
                    self.served += 1
                elif "abort" in message and (asked := tasks.get(int(message["abort"]))) is not None:
                    asked.cancel()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the service process closed its end (stopping, or gone): its requests are dropped below
        except Exception:  # a frame the host cannot read: that client's connection is closed, the others go on
            log.exception("serve: the shared engine's host dropped a client")
        finally:
            for task in list(tasks.values()):
                task.cancel()
            self._clients.discard(writer)
            writer.close()

    async def _run(self, rid: int, message: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        chosen = self._pick()
        self.in_progress[chosen] += 1
        try:
            engine = self.engines[chosen]
            async for step in engine.steps(message["ids"], message["lang"], message["retry"], message["pin"]):
                writer.write(_frame({"id": rid, "step": vars(step)}))  # not asdict: it deep-copies every step
                if writer.transport.get_write_buffer_size() > 1 << 20:
                    await writer.drain()  # a client that stopped reading: hold its requests, not the host's memory
        except RequestError as exc:
            writer.write(_frame({"id": rid, "refused": str(exc)}))
        except EngineError as exc:
            writer.write(_frame({"id": rid, "failed": str(exc)}))
        except Exception as exc:  # a bug here must not leave the request waiting for its deadline
            log.exception("serve: the shared engine's host failed a request")
            writer.write(_frame({"id": rid, "failed": f"{type(exc).__name__}: {exc}"}))
        finally:
            self.in_progress[chosen] -= 1


class SharedVllm:
    """A service process's view of the shared engine (the service's ServeEngine): the prompt's ids and the answers'
    text made here, the tokens generated by the host's engine."""

    def __init__(self, prompts: Prompts, model_name: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, on_lost: Callable[[], None] | None = None, *, engines: int = 1) -> None:
        self.prompts, self.model_name = prompts, model_name
        self.engines = engines  # how many the host holds (/healthz), as the host said
        self._reader, self._writer, self._on_lost = reader, writer, on_lost
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self._lost: str | None = None
        self._dispatch = asyncio.create_task(self._dispatching())

    @classmethod
    async def connect(cls, path: Path, on_lost: Callable[[], None] | None = None) -> SharedVllm:
        """Connect to the host at path and load the tokenizer it names; on_lost is called if the host goes away."""
        reader, writer = await asyncio.open_unix_connection(str(path), limit=_LIMIT)
        hello = await _read(reader)

        def load() -> Any:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(hello["tokenizer"])

        prompts = Prompts(await asyncio.to_thread(load))
        return cls(prompts, str(hello["model"]), reader, writer, on_lost, engines=int(hello.get("engines", 1)))

    def encode(self, text: str) -> list[int]:
        return self.prompts.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.prompts.decode(ids)

    async def _dispatching(self) -> None:
        try:
            while True:
                message = await _read(self._reader)
                queue = self._pending.get(int(message["id"]))
                if queue is not None:  # else: a request given up here whose report was already on its way
                    queue.put_nowait(message)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self._lost = f"serve: the shared engine's host went away ({type(exc).__name__})"
        except Exception as exc:  # a frame this side cannot read: the connection cannot be trusted past it
            self._lost = f"serve: the shared engine's host went away (unreadable: {type(exc).__name__}: {exc})"
        except asyncio.CancelledError:
            self._lost = "serve: closed"
            raise
        finally:
            for queue in self._pending.values():
                queue.put_nowait({"failed": self._lost})
            if self._lost != "serve: closed":
                log.error("%s", self._lost)
                if self._on_lost is not None:
                    self._on_lost()

    async def stream(self, conversation: Sequence[Message], lang: str | None, retry: Retry | None = None,
                     pin: str | None = None) -> AsyncIterator[Partial]:
        if self._lost is not None:
            raise EngineError(self._lost)
        rid = next(self._ids)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pending[rid] = queue
        finished = False
        try:
            self._writer.write(_frame({"gen": rid, "ids": self.prompts.prompt(conversation), "lang": lang,
                                       "retry": retry, "pin": pin}))
            while not finished:
                message = await queue.get()
                if "refused" in message or "failed" in message:
                    finished = True  # ended there: nothing to abort
                    if "refused" in message:
                        raise RequestError(message["refused"])
                    raise EngineError(message["failed"])
                step = Step(**message["step"])
                finished = step.finished
                yield self.prompts.partial(step)
        finally:
            del self._pending[rid]
            if not finished and self._lost is None:  # cancelled here (a client gone, a deadline): drop it there
                self._writer.write(_frame({"abort": rid}))

    def alive(self) -> bool:
        return self._lost is None

    async def close(self) -> None:
        self._dispatch.cancel()
        self._writer.close()
