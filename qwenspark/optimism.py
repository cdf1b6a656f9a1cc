"""Whether first attempts go without the grammar: while the recent share of fitting first answers pays (the service per
request, the executor function per batch)."""

from __future__ import annotations

from collections import deque

# One request in this many is written optimistically while the share is too low, so that a model (or a stream of
# reviews) whose answers come to fit again is noticed.
PROBE_EVERY = 20


class Optimism:
    """The choice per request or batch (serve.optimistic_min_fit, engine.optimistic_min_fit): optimistic until the
    last `window` first answers show fewer than `min_fit` fitting the grammar, then guided from the first token but
    for one probe in PROBE_EVERY. Optimistic while a quarter of the window is not yet seen (a start with too few
    answers to judge)."""

    def __init__(self, min_fit: float, window: int) -> None:
        self.min_fit, self._learning = min_fit, max(1, window // 4)
        self._seen, self._fits, self._guided = deque[bool](maxlen=window), 0, 0  # _fits: True in _seen, kept count

    def share(self) -> float | None:
        """The share of fitting first answers among the last window's; None before the first."""
        return self._fits / len(self._seen) if self._seen else None

    def choose(self) -> bool:
        """Whether the next request's first attempts are written without the grammar (once per request, on the
        service's hot path: no pass over the window)."""
        if self.min_fit <= 0 or len(self._seen) < self._learning or self._fits / len(self._seen) >= self.min_fit:
            self._guided = 0
            return True
        self._guided += 1
        return self._guided % PROBE_EVERY == 0

    def record(self, fitted: bool) -> None:
        """One optimistic first answer's outcome: whether it was stored without a second attempt."""
        if len(self._seen) == self._seen.maxlen:
            self._fits -= self._seen[0]  # the oldest outcome leaves the window
        self._seen.append(fitted)
        self._fits += fitted
