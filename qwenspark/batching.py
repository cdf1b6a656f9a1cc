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
    ids = encode(text)
    if len(ids) <= max_tokens:
        return text, False
    # Decoding a cut in the middle of a multi-byte character yields U+FFFD; drop it.
    return decode(ids[:max_tokens]).rstrip("\ufffd"), True
