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
more to do: no draft tokens, no reasoning parser, every grammar xgrammar's. Anything else goes to vLLM's own code.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

# Under vLLM's logger, whose handler vLLM sets up once it reads the engine's config (after the plugins are loaded).
log = logging.getLogger("vllm.plugins.qwenspark_masks")

# The engine's environment: threads for the batch matcher ("auto": half the host's hardware threads, xgrammar's own).
ENV = "QWENSPARK_BATCH_GRAMMAR_MASKS"

_MATCHERS: dict[str, Any] = {}  # one BatchGrammarMatcher (its thread pool) per thread setting and process
FILLED = {"steps": 0}  # steps whose masks the batch matcher filled, in this process (tests read it)


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
        filled = batch_fill(self, requests, structured_output_request_ids, threads)
        if filled is None:
            return own(self, requests, structured_output_request_ids, scheduled_spec_decode_tokens)
        return filled

    # setattr: patching a class of vLLM's, which its types do not foresee
    setattr(StructuredOutputManager, "grammar_bitmask", grammar_bitmask)  # noqa: B010
    setattr(StructuredOutputManager, "_qwenspark_batch_masks", True)  # noqa: B010
    setattr(StructuredOutputManager, "_qwenspark_own_grammar_bitmask", own)  # noqa: B010  vLLM's own (tests)


def batch_fill(manager: Any, requests: dict[str, Any], request_ids: list[str], threads: str) -> Any:
    """The step's masks as vLLM's grammar_bitmask returns them (an int32 array, a row per request in order), or None
    where this step needs vLLM's own path."""
    config = manager.vllm_config
    if (not request_ids or config.num_speculative_tokens or manager.reasoner_cls is not None
            or getattr(config.model_config, "is_diffusion", False) or manager._grammar_bitmask is None):
        return None  # the first guided step too: vLLM allocates the bitmask there
    bitmask = manager._grammar_bitmask
    matchers, rows = [], []
    for row, request_id in enumerate(request_ids):
        grammar = requests[request_id].structured_output_request.grammar
        matcher = getattr(grammar, "matcher", None)
        if matcher is None:  # not xgrammar's
            return None
        if grammar.is_terminated():
            bitmask[row].fill_(manager._full_mask)  # as vLLM's _fill_bitmasks: every token allowed
        else:
            matchers.append(matcher)
            rows.append(row)
    if matchers:
        _matcher(threads).batch_fill_next_token_bitmask(matchers, bitmask, rows)
    FILLED["steps"] += 1
    if FILLED["steps"] == 1:
        log.info("qwenspark: grammar masks filled by xgrammar's batch matcher (%s threads) from this step on", threads)
    return bitmask[: len(request_ids)].numpy()


def _matcher(threads: str) -> Any:
    matcher = _MATCHERS.get(threads)
    if matcher is None:
        import xgrammar

        matcher = _MATCHERS[threads] = xgrammar.BatchGrammarMatcher("auto" if threads == "auto" else int(threads))
    return matcher
