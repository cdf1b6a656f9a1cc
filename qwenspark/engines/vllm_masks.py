"""vLLM plugin behind engine.batch_grammar_masks: a step's grammar masks filled by xgrammar's batch matcher.

Why: a guided step's masks (one per answer in the step, 19 kB each) are filled by vLLM's engine-core step loop, one
after another below 129 answers a step (StructuredOutputManager.fill_bitmask_parallel_threshold) and on Python
threads above. On an H200 at 200 guided requests/s (0.6B, ~80 answers in flight) that serial fill was 24 % of the
step loop, the service's bound (bench/results/profiles/pyspy_h200_06b_200rps_guided_omp1_stop38.txt). xgrammar's
BatchGrammarMatcher fills them all in one call on native threads: the same masks (bench/grammar_masks.py checks them
bit for bit), 1.41 against 0.85 ms a step for 80 answers on two threads of this CPU
(bench/results/grammar_masks_cpu.json).

vLLM loads general plugins (the `vllm.general_plugins` entry point in pyproject.toml) in each of its processes, the
engine core among them; register() changes nothing unless the engine's environment names a thread count (ENV, set by
engines.vllm.apply_env from engine.batch_grammar_masks), and it takes over a step only where vLLM's own fill has nothing
more to do: no reasoning parser, every grammar xgrammar's. Anything else goes to vLLM's own code.

With speculative decoding (draft tokens, as the service's n-gram proposals) vLLM always fills serially: a mask per
draft position and one for the bonus token, each answer's matcher walked through its drafts and rolled back. Here the
same walk goes position by position over the whole step, each position's masks in one batch call.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

# Under vLLM's logger, whose handler vLLM sets up once it reads the engine's config (after the plugins are loaded).
log = logging.getLogger("vllm.plugins.qwenspark_masks")

# The engine's environment: threads for the batch matcher ("auto": half the host's hardware threads, xgrammar's own).
ENV = "QWENSPARK_BATCH_GRAMMAR_MASKS"

# The masks go into vLLM's own bitmask. Filling a ring of pinned buffers instead, to spare vLLM's V2 runner its copy
# into pinned memory, was measured on an H100 (stop 51, bench/results/serve_history.md): no faster, so not kept.
_MATCHERS: dict[str, Any] = {}  # one BatchGrammarMatcher (its thread pool) per thread setting and process
FILLED = {"steps": 0, "drafted": 0}  # steps whose masks the batch matcher filled, in this process, and those of them
# with draft tokens (tests read it)


def asked(environ: Mapping[str, str] = os.environ) -> str:
    """The batch matcher's threads that environ's ENV asks for (a count or "auto"); "" where vLLM fills the masks."""
    threads = environ.get(ENV, "").strip()
    return "" if threads in ("", "0") else threads


def register() -> None:
    """vLLM's general-plugin hook: patch StructuredOutputManager.grammar_bitmask where ENV asks for it (idempotent,
    as vLLM may load plugins more than once per process)."""
    threads = asked()
    if not threads:
        return
    from vllm.v1.structured_output import StructuredOutputManager

    if getattr(StructuredOutputManager, "_qwenspark_batch_masks", False):
        return
    own = StructuredOutputManager.grammar_bitmask

    def grammar_bitmask(self: Any, requests: dict[str, Any], structured_output_request_ids: list[str],
                        scheduled_spec_decode_tokens: dict[str, list[int]]) -> Any:
        filled = batch_fill(self, requests, structured_output_request_ids, threads, scheduled_spec_decode_tokens)
        if filled is None:
            return own(self, requests, structured_output_request_ids, scheduled_spec_decode_tokens)
        return filled

    # setattr: patching a class of vLLM's, which its types do not foresee
    setattr(StructuredOutputManager, "grammar_bitmask", grammar_bitmask)  # noqa: B010
    setattr(StructuredOutputManager, "_qwenspark_batch_masks", True)  # noqa: B010
    setattr(StructuredOutputManager, "_qwenspark_own_grammar_bitmask", own)  # noqa: B010  vLLM's own (tests)


def batch_fill(manager: Any, requests: dict[str, Any], request_ids: list[str], threads: str,
               drafts: Mapping[str, list[int]] | None = None) -> Any:
    """The step's masks as vLLM's grammar_bitmask returns them (an int32 array: a row per request in order, or with
    draft tokens a row per draft position and one for the bonus token), or None where this step needs vLLM's own
    path."""
    config = manager.vllm_config
    if (not request_ids or manager.reasoner_cls is not None or getattr(config.model_config, "is_diffusion", False)
            or manager._grammar_bitmask is None):
        return None  # the first guided step too: vLLM allocates the bitmask there
    grammars = [requests[r].structured_output_request.grammar for r in request_ids]
    if any(getattr(grammar, "matcher", None) is None for grammar in grammars):
        return None  # not xgrammar's
    # vLLM passes {} without speculative decoding
    step_drafts: list[Sequence[int]] = [drafts.get(r, ()) for r in request_ids] if drafts else [()] * len(grammars)
    rows = _fill_with_drafts(manager, grammars, step_drafts, threads)
    FILLED["steps"] += 1
    FILLED["drafted"] += any(step_drafts)
    if FILLED["steps"] == 1:
        log.info("qwenspark: grammar masks filled by xgrammar's batch matcher (%s threads) from this step on", threads)
    return manager._grammar_bitmask[:rows].numpy()


def _fill_with_drafts(manager: Any, grammars: list[Any], drafts: list[Sequence[int]], threads: str) -> int:
    """Fill each answer's rows (one per draft token, then the bonus token's) as vLLM's serial walk does, a draft
    position at a time for the whole step; the matchers end where they began. Returns the rows written."""
    walk = _Walk(grammars, drafts)
    depth = max(len(draft) for draft in drafts)  # 0 without speculative decoding: one row an answer, nothing to take
    for k in range(depth + 1):
        batch, rows = walk.fill_plain_rows(k, manager._grammar_bitmask, manager._full_mask)
        if batch:
            _matcher(threads).batch_fill_next_token_bitmask(batch, manager._grammar_bitmask, rows)
        if k < depth:
            walk.take(k)
    if depth:
        walk.rollback()
    return walk.starts[-1]


class _Walk:
    """The step's answers walked through their draft tokens (vLLM's StructuredOutputManager.grammar_bitmask rules)."""

    def __init__(self, grammars: list[Any], drafts: list[Sequence[int]]) -> None:
        self.matchers, self.drafts = [grammar.matcher for grammar in grammars], drafts
        # vLLM's own record of each answer's end where the step starts (cheaper than asking xgrammar), then the
        # matcher's as the walk takes drafts
        self.ended = [grammar.is_terminated() for grammar in grammars]
        # each answer's first row; the last entry is the rows in all
        self.starts = [0, *itertools.accumulate(len(draft) + 1 for draft in drafts)]
        self.advanced = [0] * len(drafts)
        self.failed: list[int | None] = [None] * len(drafts)  # the row of the draft token the grammar refused
        self.padded = [False] * len(drafts)  # past a -1 (the proposer's padding): every token allowed after it

    def fill_plain_rows(self, k: int, bitmask: Any, full: Any) -> tuple[list[Any], list[int]]:
        """Write position k's rows that need no matcher; return the matchers and rows whose masks remain."""
        batch, rows = [], []
        for n, draft in enumerate(self.drafts):
            if k > len(draft):
                continue
            row, failed = self.starts[n] + k, self.failed[n]
            if failed is not None:
                bitmask[row].copy_(bitmask[failed])  # vLLM's rule: the last good state's mask, not none
            elif self.padded[n] or self.ended[n]:
                bitmask[row].fill_(full)  # as vLLM's _fill_bitmasks: every token allowed
            else:
                batch.append(self.matchers[n])
                rows.append(row)
        return batch, rows

    def take(self, k: int) -> None:
        """Advance each answer's matcher past its draft token at position k, or mark where it stopped."""
        for n, draft in enumerate(self.drafts):
            if k >= len(draft) or self.failed[n] is not None or self.padded[n]:
                continue
            matcher = self.matchers[n]
            if draft[k] == -1:
                self.padded[n] = True
            elif not self.ended[n] and matcher.accept_token(draft[k]):
                self.advanced[n] += 1
                self.ended[n] = matcher.is_terminated()
            else:
                self.failed[n] = self.starts[n] + k
                log.error("qwenspark: the grammar refused draft token %s during the mask fill", draft[k])

    def rollback(self) -> None:
        """Put each matcher back where the step found it."""
        for matcher, count in zip(self.matchers, self.advanced, strict=True):
            if count:
                matcher.rollback(count)


def _matcher(threads: str) -> Any:
    matcher = _MATCHERS.get(threads)
    if matcher is None:
        import xgrammar

        matcher = _MATCHERS[threads] = xgrammar.BatchGrammarMatcher("auto" if threads == "auto" else int(threads))
    return matcher
