"""How requests reach vLLM through its public APIs: the engine-level LLMEngine stepped by the caller (engine core in
this process), or AsyncLLM's generate streams on an event loop of their own (engine core in its own process)."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from qwenspark.errors import EngineError, RequestError

if TYPE_CHECKING:
    from qwenspark.engines.yielding import Yielding

log = logging.getLogger(__name__)

# How long finished() waits for an answer before it returns nothing (the caller then asks again).
_WAIT_S = 1.0
# How often a yielding batch looks at the services' board (engine.yield_to_service): a service's first answer waits
# at most this long, plus the batch's step then running, before the batch stands still.
_LOOK_S = 0.005


# A request's watch (Feed.add): told the answer's token ids so far after each step, False ends the request there.
Watch = Callable[[Sequence[int]], bool]


@dataclass(frozen=True)
class Cut:
    """A request its watch ended (engines.dead_ends): vLLM's last output of it, its answer so far."""

    out: Any


class Feed(Protocol):
    """Requests in as token ids, finished answers out; what VllmEngine needs of vLLM."""

    tokenizer: Any
    vllm_config: Any

    def add(self, request_id: str, prompt_ids: list[int], params: Any, watch: Watch | None = None,
            fresh: bool = False) -> None:
        """Queue one request; raises vLLM's validation error if it refuses it at once. With a watch, params must
        report the answer as it grows (output_kind CUMULATIVE): the first step after which the watch says False drops
        the request in vLLM and reports it as a Cut. fresh: its prompt computed anew, not from the prefix cache."""
        ...

    def finished(self) -> list[tuple[str, Any]]:
        """Requests finished since the last call: (id, vLLM's final RequestOutput, a Cut, or a RequestError for a
        request vLLM refused after queueing it). Raises EngineError when the engine failed."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop requests; nothing is reported for them."""
        ...

    def shutdown(self) -> None:
        """Stop the engine core and release its memory."""
        ...


def engine_args(cfg_kwargs: dict[str, Any], model: str, *, asynchronous: bool) -> Any:
    """vLLM's (Async)EngineArgs for the keyword arguments engines.vllm.engine_kwargs makes."""
    from vllm import AsyncEngineArgs, EngineArgs
    from vllm.config import StructuredOutputsConfig

    kwargs = dict(cfg_kwargs)
    if isinstance(kwargs.get("structured_outputs_config"), dict):  # vllm.LLM converts this dict; the args do not
        kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    return (AsyncEngineArgs if asynchronous else EngineArgs)(model=model, disable_log_stats=True, **kwargs)


def offline_usage() -> Any:
    """The usage context of vllm.LLM: vLLM sizes its default batch by it (on an H200: up to 1024 sequences and 16384
    tokens per step, against 128 and 2048 for the engine classes' own default; the job wants the offline sizes)."""
    from vllm.usage.usage_lib import UsageContext

    return UsageContext.LLM_CLASS


def token_prompt() -> Callable[..., Any]:
    """How a prompt's token ids are handed to vLLM, as prompt(ids, salt=None): as the engine input its renderer would
    make of them (vllm.inputs.tokens_input, in the 0.26 of the GPU machine and the 0.32 here), not as a raw
    TokensPrompt, which vLLM renders again per request and warns is deprecated; it checks the ids and the length either
    way. salt (vLLM's cache_salt): the prompt's KV blocks computed afresh, none taken from the prefix cache."""
    try:
        from vllm.inputs import tokens_input  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # older releases take the raw prompt
        from vllm.inputs import TokensPrompt

        def raw(ids: list[int], salt: str | None = None) -> Any:
            prompt = TokensPrompt(prompt_token_ids=ids)
            if salt is not None:
                prompt["cache_salt"] = salt
            return prompt

        return raw

    def rendered(ids: list[int], salt: str | None = None) -> Any:
        return tokens_input(ids, cache_salt=salt)

    return rendered


def core_in_process() -> bool:
    """Whether vLLM runs its engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as on CPU): read after
    engines.vllm.apply_env has set the engine's environment."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"


def inspect_here(model: str) -> None:
    """Register the model's architectures with vLLM as classes imported in this process, when its core runs here.

    vLLM inspects a model class it has not seen (its interfaces: pooling, multimodal...) in a fresh Python subprocess,
    so that the parent never initialises CUDA, and caches the result under VLLM_CACHE_ROOT/modelinfos: 8.7 s of a
    first engine load on this 2-core CPU (the subprocess imports torch and vLLM again), every time the cache is new
    (a fresh machine, a container's executor). With the engine core in this process the class is imported here
    anyway to load the weights (0.8 s), so the subprocess protects nothing. vLLM's public register_model with the
    class does the same inspection in this process; architectures it does not know are left to vLLM's own error."""
    if not core_in_process():  # a core process of its own would inspect again, in a fresh Python
        return
    from vllm import ModelRegistry

    try:
        architectures = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))["architectures"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a local checkout with a config (vLLM reads the model itself and says what is wrong)
    for arch in architectures if isinstance(architectures, list) else ():
        entry = ModelRegistry.models.get(arch)
        module, name = getattr(entry, "module_name", None), getattr(entry, "class_name", None)
        if not (module and name):  # not one of vLLM's lazily registered classes
            continue
        try:
            ModelRegistry.register_model(arch, getattr(importlib.import_module(module), name))
        except Exception:  # e.g. a package the model needs is missing: left to vLLM's inspection, which says so
            continue


class InProcess:
    """vllm.LLMEngine, vLLM's documented engine-level API (its llm_engine_example), with the engine core in this
    process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as on CPU): each finished() runs one engine step here."""

    def __init__(self, args: Any, yielding: Yielding | None = None) -> None:
        from vllm import LLMEngine

        inspect_here(str(args.model))
        self._engine = LLMEngine.from_engine_args(args, usage_context=offline_usage())
        self._prompt = token_prompt()
        self.tokenizer = self._engine.get_tokenizer()
        self.vllm_config = self._engine.vllm_config
        self._yielding = yielding
        self._watches: dict[str, Watch] = {}

    def add(self, request_id: str, prompt_ids: list[int], params: Any, watch: Watch | None = None,
            fresh: bool = False) -> None:
        self._engine.add_request(request_id, self._prompt(prompt_ids, request_id if fresh else None), params)
        if watch is not None:
            self._watches[request_id] = watch

    def finished(self) -> list[tuple[str, Any]]:
        if self._yielding is not None:  # a service on this host is answering: no step now (the caller asks again)
            hold = self._yielding.hold(time.monotonic())
            if hold > 0:
                time.sleep(min(hold, _LOOK_S))
                return []
        done: list[tuple[str, Any]] = []
        cut: list[str] = []
        # vLLM reports the id we gave (newer releases add a random suffix internally only); requests without a watch
        # are reported once, finished (output_kind FINAL_ONLY).
        outs: list[Any] = self._engine.step()  # RequestOutputs (a generating model's, not a pooling one's)
        for out in outs:
            rid = out.request_id
            if out.finished:
                self._watches.pop(rid, None)
                done.append((rid, out))
            elif rid in self._watches and not self._watches[rid](out.outputs[0].token_ids):
                del self._watches[rid]
                cut.append(rid)
                done.append((rid, Cut(out)))
        if cut:
            self._engine.abort_request(cut)
        return done

    def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._watches.pop(request_id, None)
        self._engine.abort_request(list(request_ids))

    def shutdown(self) -> None:
        core = getattr(self._engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self._engine


class EventLoop:
    """vLLM's AsyncLLM with its engine core in a process of its own: every request is one generate() stream on an
    event loop in a daemon thread, so the caller's thread (a Spark task's, with no loop of its own) only adds
    requests and collects finished answers, which reach it through a queue."""

    def __init__(self, args: Any, yielding: Yielding | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="qwenspark-vllm", daemon=True)
        self._thread.start()
        self._done: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Task[None]] = {}
        try:
            # Built on the loop, so that AsyncLLM's output handler runs there.
            self._llm = self._call(self._build(args))
            tokenizer = self._llm.get_tokenizer()
            self.tokenizer = self._call(tokenizer) if asyncio.iscoroutine(tokenizer) else tokenizer  # older vLLM
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        self.vllm_config = self._llm.vllm_config
        from qwenspark.engines.vllm import client_errors

        self._prompt, self._client_errors = token_prompt(), client_errors()
        # Held here: the loop keeps only a weak reference to its tasks.
        self._giving = None if yielding is None else asyncio.run_coroutine_threadsafe(give_way(self._llm, yielding),
                                                                                       self._loop)

    @staticmethod
    async def _build(args: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(args, usage_context=offline_usage())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def add(self, request_id: str, prompt_ids: list[int], params: Any, watch: Watch | None = None,
            fresh: bool = False) -> None:
        prompt = self._prompt(prompt_ids, request_id if fresh else None)
        self._loop.call_soon_threadsafe(self._open, request_id, prompt, params, watch)

    def _open(self, request_id: str, prompt: Any, params: Any, watch: Watch | None) -> None:
        self._streams[request_id] = self._loop.create_task(self._answer(request_id, prompt, params, watch))

    async def _answer(self, request_id: str, prompt: Any, params: Any, watch: Watch | None) -> None:
        try:
            # Cancelling this task (abort), or leaving the stream (a watch's False), makes AsyncLLM abort the request.
            async with aclosing(self._llm.generate(prompt, params, request_id)) as outs:
                async for out in outs:
                    if out.finished:
                        self._done.put((request_id, out))
                    elif watch is not None and not watch(out.outputs[0].token_ids):
                        self._done.put((request_id, Cut(out)))
                        return
        except self._client_errors as exc:  # vLLM's validation of this one request
            self._done.put((request_id, RequestError(str(exc))))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine core failed or died: the task must fail, not store error rows
            self._done.put((request_id, EngineError(f"vllm: {type(exc).__name__}: {exc}")))
        finally:
            self._streams.pop(request_id, None)

    def finished(self) -> list[tuple[str, Any]]:
        try:
            out = [self._done.get(timeout=_WAIT_S)]
        except queue.Empty:
            if not self._thread.is_alive():
                raise EngineError("vllm: the engine's event loop stopped") from None
            return []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        failed = next((x for _, x in out if isinstance(x, EngineError)), None)
        if failed is not None:
            raise failed
        return out

    def abort(self, request_ids: Sequence[str]) -> None:
        self._loop.call_soon_threadsafe(self._cancel, list(request_ids))

    def _cancel(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.cancel()

    def shutdown(self) -> None:
        llm = self.__dict__.pop("_llm", None)
        if llm is not None:
            shut_down(llm)
        if self._thread.is_alive():
            # AsyncLLM's own tasks (its output handler) end cancelled, not destroyed pending with the loop.
            asyncio.run_coroutine_threadsafe(_cancel_all(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)


async def give_way(llm: Any, yielding: Yielding) -> None:
    """Pause the engine core's scheduling (vLLM's pause_generation, keeping every request and its cache) while the
    duty cycle holds, resume it when it runs: for as long as the engine lives."""
    paused = False
    try:
        while True:
            hold = yielding.hold(time.monotonic())
            if (hold > 0) != paused:
                if hold > 0:
                    await llm.pause_generation(mode="keep", clear_cache=False)  # returns once the core's step ended
                    yielding.stopped(time.monotonic())
                else:
                    await llm.resume_generation()
                paused = hold > 0
            await asyncio.sleep(min(hold, _LOOK_S) if hold > 0 else _LOOK_S)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # an engine core that is gone fails its requests, which say so; the batch runs on
        log.warning("engine.yield_to_service: the batch no longer gives way (%s: %s)", type(exc).__name__, exc)


async def _cancel_all() -> None:
    """Cancel every other task of the running loop and wait for them to end."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def shut_down(llm: Any) -> None:
    """Shut an AsyncLLM down once."""
    llm.shutdown()
    # AsyncLLM.__del__ shuts down again, and something in vLLM keeps the engine alive until interpreter exit, where
    # that second shutdown finds its modules gone and prints a TypeError traceback (at every Ctrl-C of the service).
    llm.shutdown = _shut


def _shut(timeout: float | None = None) -> None:
    """An engine's shutdown once it has been shut down."""
