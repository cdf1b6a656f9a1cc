"""What one guided step's grammar masks cost the engine core: vLLM's own serial fill against xgrammar's batch matcher
(engine.batch_grammar_masks, qwenspark/engines/vllm_masks.py), measured in one run, with the masks compared bit for bit.

    .venv/bin/python bench/grammar_masks.py [--tokenizer DIR] [--answers 40,80,160] [--threads 1,2,8]
        [--json-out bench/results/grammar_masks_cpu.json]

A step of N answers under v13's grammars (half zh, half en), each at a seeded point of a real dev answer; a step's
fill is timed as the median of 5 rounds of 200 fills. Prints one line per N: ms a step for the serial fill (what vLLM
does below 129 answers a step) and for the batch matcher at each thread count, and their ratio.

--drafts K: with speculative decoding (the service's n-gram proposals): each answer carries its own next K tokens as
draft tokens, and a step is K + 1 masks an answer; vLLM always fills those serially (StructuredOutputManager's
grammar_bitmask, timed as it is) against vllm_masks.batch_fill, a draft position at a time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ANSWERS = {
    "en": ['negative\n"The room was dirty and the staff were rude; breakfast was cold."\nroom:negative '
           "service:negative breakfast/food:negative",
           'positive\n"Great location near the station, friendly staff and a quiet room."\nlocation:positive '
           "service:positive room:positive"],
    "zh": ['mixed\n"房间干净，位置好，但是早餐一般。"\nroom:positive location:positive breakfast/food:neutral',
           'negative\n"隔音太差，空调噪音大，前台态度冷淡。"\nroom:negative facilities:negative service:negative'],
}


def _median_ms(fill: Callable[[], None], rounds: int = 5, reps: int = 200) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(reps):
            fill()
        times.append((time.perf_counter() - started) / reps * 1000)
    return round(statistics.median(times), 4)


def main() -> int:
    import torch
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from qwenspark.config import load_config
    from qwenspark.parse import answer_grammars
    from qwenspark.serve.app import serve_engine_config

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, default=ROOT / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct")
    p.add_argument("--answers", default="40,80,160")
    p.add_argument("--threads", default="1,2,8")
    p.add_argument("--drafts", type=int, default=0, help="draft tokens an answer a step (0: none)")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info)
    grammars = answer_grammars(serve_engine_config(load_config(ROOT / "conf" / "local.yaml", ["prompt.version=v13"])))
    compiled = {lang: compiler.compile_grammar(grammars[lang]["grammar"]) for lang in ANSWERS}
    threads = [int(t) for t in args.threads.split(",")]
    batch = {t: xgr.BatchGrammarMatcher(t) for t in threads}
    rows: list[dict[str, Any]] = []
    if args.drafts:
        rows = [_drafted(int(n), args.drafts, threads, tokenizer, compiled=compiled) for n in args.answers.split(",")]
    for count in (int(n) for n in args.answers.split(",") if not args.drafts):
        rng = random.Random(count)
        matchers = []
        for n in range(count):
            lang = "zh" if n % 2 else "en"
            ids = tokenizer.encode(rng.choice(ANSWERS[lang]), add_special_tokens=False)
            matcher = xgr.GrammarMatcher(compiled[lang])
            for token in ids[: rng.randrange(len(ids))]:
                assert matcher.accept_token(token)
            matchers.append(matcher)
        bitmask = xgr.allocate_token_bitmask(max(count, 256), info.vocab_size)
        indices = list(range(count))

        def serial(m: list[Any] = matchers, b: Any = bitmask) -> None:
            for row, matcher in enumerate(m):
                matcher.fill_next_token_bitmask(b, row)

        serial()
        reference = bitmask[:count].clone()
        row: dict[str, Any] = {"answers": count, "serial_ms": _median_ms(serial)}
        for t in threads:
            bitmask.zero_()
            batch[t].batch_fill_next_token_bitmask(matchers, bitmask, indices)
            assert torch.equal(bitmask[:count], reference), f"the batch matcher's masks differ ({t} threads)"
            row[f"batch_{t}_ms"] = _median_ms(
                lambda t=t, m=matchers, b=bitmask, i=indices: batch[t].batch_fill_next_token_bitmask(m, b, i))
            row[f"serial_vs_batch_{t}"] = round(row["serial_ms"] / row[f"batch_{t}_ms"], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json_out:
        import os

        args.json_out.write_text(json.dumps({"tokenizer": args.tokenizer.name, "cpus": os.cpu_count(),
                                             "drafts": args.drafts, "steps": rows}, indent=1) + "\n")
    return 0


def _drafted(count: int, drafts: int, threads: list[int], tokenizer: Any, *, compiled: dict[str, Any]
             ) -> dict[str, Any]:
    """One step of count answers, each with its own next `drafts` tokens as drafts: vLLM's fill against ours."""
    from types import SimpleNamespace

    import torch
    import xgrammar as xgr
    from vllm.v1.structured_output import _CONSTRAINED_FROM_START, StructuredOutputManager
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    from qwenspark.engines import vllm_masks

    rng = random.Random(count)
    requests: dict[str, Any] = {}
    proposed: dict[str, list[int]] = {}
    for n in range(count):
        lang = "zh" if n % 2 else "en"
        ids = tokenizer.encode(rng.choice(ANSWERS[lang]), add_special_tokens=False)
        grammar = XgrammarGrammar(vocab_size=len(tokenizer), matcher=xgr.GrammarMatcher(compiled[lang]),
                                  ctx=compiled[lang])
        at = rng.randrange(len(ids) - drafts)
        assert grammar.accept_tokens(str(n), ids[:at])
        requests[str(n)] = SimpleNamespace(structured_output_request=SimpleNamespace(grammar=grammar))
        proposed[str(n)] = ids[at: at + drafts]
    ids_ = list(requests)
    manager: Any = SimpleNamespace(  # what grammar_bitmask reads of vLLM's StructuredOutputManager
        vllm_config=SimpleNamespace(num_speculative_tokens=drafts, model_config=SimpleNamespace(is_diffusion=False)),
        reasoner_cls=None, _grammar_bitmask=xgr.allocate_token_bitmask(count * (1 + drafts), len(tokenizer)),
        _full_mask=torch.tensor(-1, dtype=torch.int32), fill_bitmask_parallel_threshold=128,
        _get_constraint_bounds=lambda request, tokens, **_: _CONSTRAINED_FROM_START)
    manager._fill_bitmasks = lambda batch: StructuredOutputManager._fill_bitmasks(manager, batch)

    def serial() -> Any:
        return StructuredOutputManager.grammar_bitmask(manager, requests, ids_, proposed)

    reference = serial().copy()
    row: dict[str, Any] = {"answers": count, "drafts": drafts, "serial_ms": _median_ms(serial, reps=50)}
    for t in threads:
        manager._grammar_bitmask.zero_()
        got = vllm_masks.batch_fill(manager, requests, ids_, str(t), proposed)
        assert (got == reference).all(), f"the batch matcher's masks differ ({t} threads)"
        def ours(t: int = t) -> None:
            vllm_masks.batch_fill(manager, requests, ids_, str(t), proposed)

        row[f"batch_{t}_ms"] = _median_ms(ours, reps=50)
        row[f"serial_vs_batch_{t}"] = round(row["serial_ms"] / row[f"batch_{t}_ms"], 2)
    print(json.dumps(row), flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
