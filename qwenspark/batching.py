"""Re-chunk an iterator of pandas frames into fixed-size batches; token-aware truncation of review text."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import pandas as pd


def rechunk(frames: Iterable[pd.DataFrame], size: int) -> Iterator[pd.DataFrame]:
    """Yield frames of exactly `size` rows (the last may be shorter), whatever sizes come in.

    Spark's Arrow batches follow partition and maxRecordsPerBatch sizes (and AQE coalescing); the engine
    should see the configured batch size instead. Rows keep their order; no row is dropped or repeated.
    """
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    pending: list[pd.DataFrame] = []
    pending_rows = 0
    for frame in frames:
        start = 0
        while start < len(frame):
            take = min(size - pending_rows, len(frame) - start)
            pending.append(frame.iloc[start : start + take])
            pending_rows += take
            start += take
            if pending_rows == size:
                yield _concat(pending)
                pending, pending_rows = [], 0
    if pending_rows:
        yield _concat(pending)


def _concat(parts: list[pd.DataFrame]) -> pd.DataFrame:
    return parts[0].reset_index(drop=True) if len(parts) == 1 else pd.concat(parts, ignore_index=True)


def truncate_by_tokens(
    text: str,
    max_tokens: int,
    encode: Callable[[str], Sequence[int]],
    decode: Callable[[Sequence[int]], str],
) -> tuple[str, bool]:
    """Cut text to at most max_tokens tokens; returns (text, truncated)."""
    # Most reviews are far below the cap, and tokenising each one only to learn that was 11 % of the online
    # service's CPU (bench/results/profiles/pyspy_h200_06b_200rps_stop32.txt). A tokenizer's token is at least one
    # byte of UTF-8 (byte-level BPE such as Qwen's; SentencePiece's byte fallback, plus its one leading "▁"), so
    # a text of fewer bytes than the cap fits without being tokenised (85 % of the dev reviews at the default 768).
    if len(text) < max_tokens and len(text.encode("utf-8")) < max_tokens:
        return text, False
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text, False
    # Decoding a cut in the middle of a multi-byte character yields U+FFFD; drop it.
    return decode(ids[:max_tokens]).rstrip("\ufffd"), True
