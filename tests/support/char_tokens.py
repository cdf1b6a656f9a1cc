"""Test engines' tokenizer: one token per character, so token counts and caps are easy to reason about."""

from __future__ import annotations

from collections.abc import Sequence


class CharTokens:
    """encode/decode of a test engine: a character's code point is its token id."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(map(chr, ids))
