"""The service's engine: one conversation in, its answer as it grows out (the label first), on vLLM's AsyncLLM or,
for any other engine.kind, the job's own engine in worker threads."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, MutableMapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Engine, Message, Retry, fresh_prompt
from qwenspark.engines.dead_ends import DEAD_END, DeadEnds, cuts_dead_ends, reader
from qwenspark.engines.vllm_feeds import token_prompt
from qwenspark.engines.yielding import publish, unpublish
from qwenspark.errors import EngineError, RequestError

log = logging.getLogger("qwenspark.serve")


# Tokens of an answer decoded as they come, for its label (the first field: "positive\n" or '{"sentiment":"mixed"'
# is at most 8 tokens in Qwen's vocabulary); later ones only when the answer is whole. A Partial past these is not
# sent, so the text of one that is sent is always the answer so far.
EARLY_TOKENS = 16


# The service's engine settings on a GPU where engine.engine_kwargs leaves them unset, measured on an H200 at 100
# requests/s, 7B shape (bench/results/serve_latency_h200_stop32.json, one host, one sitting):
# - Every step as one CUDA graph (cudagraph_mode FULL), captured up to the step's token budget. At a steady arrival
#   rate most steps mix a new prompt's prefill with the running answers' decoding; vLLM's default (FULL_AND_PIECEWISE,
#   graphs up to 256 tokens) ran those in piecewise graphs or none (the steps are larger), leaving the engine core's
#   Python to launch each layer's kernels: 3.3 cores busy and saturated at 68 answers/s (answer P50 4.9 s), against
#   1.5 cores and 94.5/s (P50 0.50 s) with full graphs. FlashAttention 3 (Hopper) runs mixed steps in a graph; on a
#   GPU or backend that cannot, vLLM itself falls back to FULL_AND_PIECEWISE and logs why.
# - Triton attention (attention_config.backend TRITON_ATTN) in those graphs, not FlashAttention 3. With FA3's mixed
#   full graphs vLLM 0.26's V2 runner ends 0.1-2 % of answers in an error on some H100 hosts (FULL_AND_PIECEWISE or
#   the V1 runner had none, at a whole answer P99 of 1.7-2.3 s against 0.6-0.7 s, stop 54), and it alters others
#   that still fit the grammar: interleaved on one H100 (stop 57, the 0.5B's real weights, 200 requests/s, one
#   engine), FA3's three runs wrote 49.0-50.2 tokens an answer and 22-87 summaries taken from a prompt's example
#   (borrowed retries), Triton's three 47.8 and 9-12 each time, with no fault; warm whole answer P99 869 and 615 ms
#   against FA3's 972 and 752 ms, label P99 98 and 62 against 73 and 101 ms (bench/results/
#   serve_latency_h100_stop57.json). Faults that still come are generated again (analyze.FAULT_RETRIES).
# - 256 sequences at once, not the engine class's 128: at 100/s about as many answers are in flight, and the 129th
#   waited for a free seat (label P99 1.5-2.2 s with 128, 0.73 s with 256). `vllm serve`'s 1,024 sequences and 8,192
#   tokens per step were worse (stop 29: label P99 2.6 s against 411 ms at 50/s): a large step delays every answer.
SERVE_GPU_DEFAULTS: dict[str, Any] = {"max_num_seqs": 256, "max_num_batched_tokens": 2048}
GRAPH_TOKENS_MAX = 2048  # graphs captured for steps of up to this many tokens: each size is a capture at start
GRAPH_ATTENTION = "TRITON_ATTN"  # the attention backend of those graphs, unless engine_kwargs names one


# The service's engine settings on a CPU where engine.engine_kwargs leaves them unset: prompt-lookup (n-gram)
# speculative decoding. An answer's JSON keys come from the prompt's examples and its summary often from the review,
# so 4 tokens proposed from the prompt's own n-grams are mostly accepted (79 % on 24 dev reviews, about 3 answer
# tokens a step), and one answer on a CPU is bound by its number of steps: on 2 cores with the default 0.5B and v10
# the whole answer's P50 went from 4.8 to 2.4 s for one client and 5.6 to 3.3 s for four, the same labels on 600 dev
# reviews (bench/results/serve_latency_cpu_stop48.json). Not for the batch: with 32 answers a step the CPU is
# compute-bound and verifying the proposals cost 32 % of its reviews/s. Not on a GPU: there vLLM turns off its
# asynchronous scheduling and V2 model runner with them, and the step is the engine core's CPU; with the 0.5B's real
# weights at 200 guided requests/s on an H100 the whole answer's P99 went from 0.91-1.06 to 2.5-2.7 s
# (bench/results/serve_latency_h100_stop50.json).
SERVE_CPU_DEFAULTS: dict[str, Any] = {
    "speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                           "prompt_lookup_max": 4},
}


# Tokens of each warm-up answer (AsyncVllm.warm): enough for the grammar's mask to be applied on the GPU.
WARM_TOKENS = 2


def gpu_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs (engines.vllm.engine_kwargs) with the service's GPU defaults under what the user set."""
    out = {**SERVE_GPU_DEFAULTS, **kwargs}
    if out.get("enforce_eager"):
        return out
    graphs = dict(out.get("compilation_config") or {})
    graphs.setdefault("cudagraph_mode", "FULL")
    graphs.setdefault("max_cudagraph_capture_size", min(int(out["max_num_batched_tokens"]), GRAPH_TOKENS_MAX))
    out["compilation_config"] = graphs
    attention = out.get("attention_config") or {}
    if "backend" not in attention and "attention_backend" not in out:
        out["attention_config"] = {**attention, "backend": GRAPH_ATTENTION}
    return out


def cpu_kwargs(kwargs: dict[str, Any], chosen: Mapping[str, Any]) -> dict[str, Any]:
    """kwargs (engines.vllm.engine_kwargs) with the service's CPU defaults for what engine.engine_kwargs (chosen)
    leaves out; a key set there to null stays off (engine_kwargs has dropped it from kwargs)."""
    return {**{k: v for k, v in SERVE_CPU_DEFAULTS.items() if k not in chosen}, **kwargs}


@dataclass(frozen=True)
class Partial:
    """The answer so far; done holds the whole completion on the last one."""

    text: str
    label_logprobs: dict[str, float] | None = None  # once the sentiment has started (engines that report them)
    done: Completion | None = None


class ServeEngine(Protocol):
    """What the service needs of an engine: its tokenizer (the review's token cap) and a stream per request."""

    model_name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of text (no special tokens)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids."""
        ...

    def stream(self, conversation: Sequence[Message], lang: str | None, retry: Retry | None = None,
               pin: str | None = None) -> AsyncIterator[Partial]:
        """The answer to one conversation as it grows; the last Partial has done set. pin: a guided retry's label,
        forced by its grammar (the label the service already sent). Cancelling the iteration drops the request from
        the engine."""
        ...

    def alive(self) -> bool:
        """False once the engine can answer nothing more (its process died): the service then stops, red."""
        ...

    async def close(self) -> None:
        """Release the model."""
        ...


@dataclass(frozen=True)
class Step:
    """An answer in progress as the engine reports it, in token ids: what AsyncVllm.steps yields and what crosses
    from a shared engine to the service process that decodes it (qwenspark.serve.shared)."""

    ids: list[int]  # the answer so far (whole once finished)
    text: str | None = None  # vLLM's own text, where it detokenises (the label's log-probabilities need it)
    label_logprobs: dict[str, float] | None = None
    finish_reason: str | None = None
    tokens_in: int = 0
    finished: bool = False


class Prompts:
    """The tokenizer's side of the service's vLLM engine: a conversation's prompt ids, an answer's text."""

    def __init__(self, tokenizer: Any) -> None:
        from qwenspark.engines.vllm import PromptIds, fast_encode

        self._tokenizer = tokenizer
        self._encode = fast_encode(tokenizer)
        self._prompt_ids = PromptIds(self._encode)  # the prompt's text around the review tokenised once

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))

    def prompt(self, conversation: Sequence[Message]) -> list[int]:
        """The conversation's chat prompt as token ids, as vLLM takes them."""
        text = self._tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True)
        return self._prompt_ids(str(text), conversation[-1]["content"])

    def partial(self, step: Step) -> Partial:
        """The step as the service reads it: the answer's text so far, and the whole completion on the last."""
        from qwenspark.engines.vllm import answer_text

        text = step.text if step.text is not None else answer_text(self._tokenizer, step.ids)
        done = Completion(text, step.finish_reason, step.tokens_in, len(step.ids), step.label_logprobs) \
            if step.finished else None
        return Partial(text, step.label_logprobs, done)


def gpu_mask_threads(cfg: EngineConfig, environ: MutableMapping[str, str], cores: int) -> str:
    """Threads of xgrammar's batch matcher for a service engine on a GPU, put in environ for its engine core's vLLM
    plugin: engine.batch_grammar_masks (apply_env set it), else the environment's (a count or "auto"), else half the
    cores, at most 8; "" where vLLM fills the masks itself."""
    from qwenspark.engines.vllm_masks import ENV, asked
    from qwenspark.resources import service_mask_threads

    if cfg.batch_grammar_masks is None:
        environ.setdefault(ENV, str(service_mask_threads(cores)))
    return asked(environ)


class AsyncVllm:
    """vLLM's AsyncLLM (its public async API): concurrent requests join one continuous batch; each prompt is handed
    over as token ids, tokenised once here."""

    def __init__(self, llm: Any, tokenizer: Any, params: dict[tuple[str | None, Retry | None], Any],
                 model: str, cfg: EngineConfig | None = None) -> None:
        self._llm, self._tokenizer, self._params, self.model_name = llm, tokenizer, params, model
        self._cfg = cfg
        self.prompts = Prompts(tokenizer)
        # Without label log-probabilities, answers come as new token ids (sampling_params): reported while the
        # label is still to come, then once, whole, at the end.
        self._ids_only = cfg is not None and not cfg.label_logprobs
        self._pinned: dict[tuple[str | None, str], Any] = {}  # (language, label) -> its StructuredOutputsParams
        self._ids = itertools.count()
        self._prompt = token_prompt()
        # Batch engines on this host read it to give way (engine.yield_to_service; qwenspark/engines/yielding.py).
        self._busy = publish()

    @classmethod
    async def start(cls, cfg: EngineConfig) -> AsyncVllm:
        """Load the model (in vLLM's engine-core process) for cfg, set as templated() sets it for the prompt."""
        from qwenspark.engines.vllm import apply_env, engine_kwargs, gpu_env, import_vllm, on_gpu, sampling_params
        from qwenspark.engines.vllm_feeds import engine_args, inspect_here

        apply_env(cfg)
        import_vllm()
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = engine_kwargs(cfg)
        if on_gpu():
            gpu_env(os.environ, chosen=os.environ)  # engine.env (applied above) and the shell win
            threads = gpu_mask_threads(cfg, os.environ, len(os.sched_getaffinity(0)))
            log.info("serve: grammar masks filled %s", f"by xgrammar's batch matcher on {threads} threads"
                     if threads else "by vLLM, one answer after another")
            kwargs = gpu_kwargs(kwargs)
            log.info("serve: vLLM on the GPU with %s sequences at once, %s tokens a step, CUDA graphs %s, attention %s",
                     kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"], kwargs.get("compilation_config", "off"),
                     kwargs.get("attention_config") or kwargs.get("attention_backend") or "vLLM's choice")
        else:
            kwargs = cpu_kwargs(kwargs, cfg.engine_kwargs)
            log.info("serve: vLLM on the CPU, speculative decoding %s", kwargs.get("speculative_config") or "off")
        inspect_here(cfg.model)  # with the engine core in this process (as on CPU)
        llm = AsyncLLM.from_engine_args(engine_args(kwargs, cfg.model, asynchronous=True))
        tokenizer = llm.get_tokenizer()
        if inspect.isawaitable(tokenizer):  # older releases: a coroutine
            tokenizer = await tokenizer
        engine = cls(llm, tokenizer, sampling_params(cfg), cfg.model, cfg)
        started = time.perf_counter()
        count = await engine.warm()
        log.info("serve: engine warmed with %d answer settings in %.1f s", count, time.perf_counter() - started)
        return engine

    async def warm(self) -> int:
        """Run one short answer under each of the service's sampling settings (every attempt, every language), all at
        once, before the service takes a request; return how many. vLLM builds its grammar backend (the
        vocabulary's tables), compiles the first grammar and compiles the GPU's mask kernel at the first guided
        request, inside the engine core's step loop: on the H200 every answer in flight waited about a second at
        the first retry of a load (bench/results/serve_latency_h200_stop33.json). A retry pinned to a label compiles
        its own grammar when first needed, in vLLM's compile threads, delaying that answer only (warming the four
        pins of every setting too took 10.4 s instead of 4.9 s with v10 on this CPU; on the H200, loads without
        the warm-up showed no stall after the first second, while pinned retries began throughout)."""
        settings = list({id(params): params for params in self._params.values()}.values())  # "fault" is "grammar"
        ids = self.prompts.encode("warm-up")

        async def answer(params: Any) -> None:
            short = params.clone()
            short.max_tokens = WARM_TOKENS
            async for _ in self._llm.generate(self._prompt(ids), short, f"warm-{next(self._ids)}"):
                pass

        await asyncio.gather(*(answer(params) for params in settings))
        return len(settings)

    def encode(self, text: str) -> list[int]:
        return self.prompts.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.prompts.decode(ids)

    @property
    def tokenizer_path(self) -> str:
        """Where the tokenizer was loaded from (a shared engine's service processes load the same)."""
        return str(getattr(self._tokenizer, "name_or_path", "") or self.model_name)

    def _settings(self, lang: str | None, retry: Retry | None, pin: str | None) -> Any:
        """The sampling settings of one attempt; with pin, a copy whose grammar allows only that label."""
        params = self._params.get((lang, retry), self._params[None, retry])
        if pin is None or params.structured_outputs is None or self._cfg is None:
            return params
        from vllm.sampling_params import StructuredOutputsParams

        from qwenspark.parse import answer_grammars

        key = (lang if (lang, retry) in self._params else None, pin)
        if key not in self._pinned:
            self._pinned[key] = StructuredOutputsParams(**answer_grammars(self._cfg, pin)[key[0]])
        pinned = params.clone()
        pinned.structured_outputs = self._pinned[key]
        return pinned

    async def stream(self, conversation: Sequence[Message], lang: str | None, retry: Retry | None = None,
                     pin: str | None = None) -> AsyncIterator[Partial]:
        async with aclosing(self.steps(self.prompts.prompt(conversation), lang, retry, pin)) as steps:
            async for step in steps:
                yield self.prompts.partial(step)

    async def steps(self, ids: list[int], lang: str | None, retry: Retry | None = None,
                    pin: str | None = None) -> AsyncGenerator[Step, None]:
        """The answer to a prompt given as token ids, as it grows: its first tokens (the label) one by one, then
        whole (every step, with vLLM's text, where the label's log-probabilities are asked for). An answer in lines
        written without the grammar ends at its first dead end (finish_reason DEAD_END, parse.lines_viable)."""
        from qwenspark.engines.vllm import _label_logprobs

        params = self._settings(lang, retry, pin)
        reader = self._dead_ends(lang, params)
        answer: list[int] = []
        if self._busy is not None:
            self._busy.add(1)
        try:
            # AsyncLLM aborts the request itself when this iteration is cancelled (a client gone, a timeout) or
            # closed (a dead end).
            request_id = f"serve-{next(self._ids)}"
            prompt = self._prompt(ids, request_id if fresh_prompt(retry) else None)
            async with aclosing(self._llm.generate(prompt, params, request_id)) as outs:
                async for out in outs:
                    best = out.outputs[0]
                    if not self._ids_only:
                        yield Step(list(best.token_ids), best.text, _label_logprobs(best) if best.logprobs else None,
                                   best.finish_reason, len(ids), out.finished)
                        continue
                    answer.extend(best.token_ids)
                    if out.finished:
                        yield Step(answer, None, None, best.finish_reason, len(ids), True)
                    elif reader is not None and (end := reader.dead_end(answer)) is not None:
                        yield Step(answer[:end], None, None, DEAD_END, len(ids), True)
                        return
                    elif len(answer) <= EARLY_TOKENS:
                        yield Step(list(answer))
        except ValueError as exc:  # vLLM's validation of this request (a prompt longer than the context)
            raise RequestError(str(exc)) from exc
        except Exception as exc:  # the engine core failed or died: the service answers 503, never error rows
            log.exception("serve: the engine failed")
            raise EngineError(f"vllm: {type(exc).__name__}: {exc}") from exc
        finally:
            if self._busy is not None:
                self._busy.add(-1)

    def _dead_ends(self, lang: str | None, params: Any) -> DeadEnds | None:
        """A reader of an attempt's dead ends, for an answer in lines written without the grammar (an optimistic
        version's first attempt); None for any other."""
        cfg = self._cfg
        if cfg is None or not self._ids_only or not cuts_dead_ends(cfg, params.structured_outputs is not None):
            return None
        return reader(cfg, self._tokenizer, lang)

    def alive(self) -> bool:
        return self._llm is not None and not self._llm.errored

    async def close(self) -> None:
        from qwenspark.engines.vllm_feeds import shut_down

        llm, self._llm = self._llm, None
        if llm is not None:
            shut_down(llm)
        if self._busy is not None:
            self._busy = None
            unpublish()


class Threaded:
    """Any job engine (openai, transformers, custom) behind the service: each request is one generate() in a worker
    thread; the label comes with the whole answer. Engines that are not thread-safe run one request at a time."""

    def __init__(self, engine: Engine, *, concurrent: bool) -> None:
        self._engine, self.model_name = engine, engine.model_name
        self._lock = None if concurrent else threading.Lock()

    def encode(self, text: str) -> list[int]:
        return self._engine.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._engine.decode(ids)

    def _generate(self, conversation: Sequence[Message], lang: str | None, retry: Retry | None) -> Completion:
        options = {"retry": retry} if retry is not None else {}
        if self._lock is None:
            return self._engine.generate([conversation], [lang or ""], **options)[0]
        with self._lock:
            return self._engine.generate([conversation], [lang or ""], **options)[0]

    async def stream(self, conversation: Sequence[Message], lang: str | None, retry: Retry | None = None,
                     pin: str | None = None) -> AsyncIterator[Partial]:
        # pin is never needed here: the label is sent with the whole answer, after any retry.
        done = await asyncio.to_thread(self._generate, conversation, lang, retry)
        yield Partial(done.text, done.label_logprobs, done)

    def alive(self) -> bool:
        return True  # these engines fail request by request (503), and recover on their own (a remote server)

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.close)


async def start_engine(cfg: EngineConfig) -> ServeEngine:
    """The service's engine for cfg (already templated for the prompt version)."""
    if cfg.kind == "vllm":
        return await AsyncVllm.start(cfg)
    from qwenspark.engines import build_engine

    engine = await asyncio.to_thread(build_engine, cfg)
    return Threaded(engine, concurrent=cfg.kind == "openai")
