"""The Engine protocol and the Completion record every engine returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

Message = dict[str, str]


@dataclass(frozen=True)
class Completion:
    """One generated answer and its token accounting."""

    text: str
    finish_reason: str | None  # "stop", "length", ... as the engine reports it
    tokens_in: int
    tokens_out: int


@runtime_checkable
class Engine(Protocol):
    """A loaded model that turns chat conversations into completions, one per conversation, in order.

    generate() raises ValueError/TypeError for a request the engine refuses (a per-row problem: the
    caller isolates the row); any other exception means the engine itself failed (fatal for the task).
    """

    model_name: str

    def encode(self, text: str) -> list[int]:
        """Token ids of text (no special tokens)."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids."""
        ...

    def generate(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        """One completion per conversation, same order, with the engine's sampling settings."""
        ...

    def close(self) -> None:
        """Release the model and its memory."""
        ...


@runtime_checkable
class StreamingEngine(Engine, Protocol):
    """An engine that takes requests one at a time and reports them as they finish (continuous batching)."""

    def submit(self, conversation: Sequence[Message]) -> str:
        """Queue one request; returns its id. Raises ValueError/TypeError if the engine refuses it."""
        ...

    def step(self) -> list[tuple[str, Completion]]:
        """Advance the engine one step; the requests that finished in it."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop requests (a task that ends early must not leave work behind in a cached engine)."""
        ...
