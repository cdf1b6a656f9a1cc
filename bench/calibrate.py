"""Fit a prompt version's label calibration (qwenspark.calibrate) on dev rows that no report is made on.

    .venv/bin/python bench/calibrate.py [--prompt v4] [--model qwen2.5-coder-0.5b] [--limit 400] [--seed 5] [--refit]

Labels a seeded sample of the labelled dev reviews (../shared/data/hotel_reviews, half zh, half en) with the
executor-side function (`PreparedBatch`, the engine conf/local.yaml builds, label log-probabilities on), leaving out
the held-out report sample (600 rows, seed 11, drawn after the 120-row choosing sample of seed 3: the rows of
bench/results/eval/*_n600_s11.json). Then, per language, searches a bias for negative, neutral and mixed (positive
is the reference, 0) on a 0.25 grid that maximises the language's score under its gold scheme (qwenspark/scoring.py:
zh binary accuracy, its neutral bias left 0 and mixed bounded at MIXED_FLOOR; en the mean of 3-class accuracy and
macro-F1), ties to the smallest bias. Prints the bias, the
score before and after, and writes bench/results/calibration_<prompt>_<model>.json (the rows' log-probabilities too),
whose "label_bias" a prompt version freezes (prompts.py). The report on held-out rows is `qwenspark eval` of that
version (bench/eval_grid.py --limit 600 --seed 11 --exclude-sample 120:3).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.analyze import AnalyzeSpec, PreparedBatch, templated  # noqa: E402
from qwenspark.calibrate import calibrated  # noqa: E402
from qwenspark.config import load_config  # noqa: E402
from qwenspark.evaluate import load_labelled, sample  # noqa: E402
from qwenspark.pipeline import prepare_model  # noqa: E402
from qwenspark.schemas import CLEAN_SCHEMA  # noqa: E402
from qwenspark.scoring import accuracy, macro_f1, per_class, scheme, scored  # noqa: E402

DEV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"
HELD_OUT = (600, 11, [(120, 3)])  # the report sample, and the sample excluded before drawing it
GRID = [x / 2 for x in range(-12, 13)]  # -6 .. 6 in steps of 0.5, for the 3 biases of star gold
FINE = [x / 10 for x in range(-60, 61)]  # -6 .. 6 in steps of 0.1, for the biases of binary gold
OTHERS = ("negative", "neutral", "mixed")
MIXED_FLOOR = -1.5  # the lowest bias on mixed under binary gold (fit)


def fit_rows(limit: int, seed: int) -> pd.DataFrame:
    """A seeded dev sample without the held-out report rows."""
    n, s, before = HELD_OUT
    held = set(load_labelled(DEV, n, s, exclude=before)["source_id"])
    everything = load_labelled(DEV, None)
    return sample(everything[~everything["source_id"].isin(held)], limit, seed)


def label_rows(rows: pd.DataFrame, prompt: str, overrides: Sequence[str]) -> list[dict[str, Any]]:
    """Each row's answer and label log-probabilities, through PreparedBatch with the configured engine."""
    from qwenspark.engines import build_engine

    cfg = prepare_model(load_config(ROOT / "conf" / "local.yaml", list(overrides)))
    engine_cfg = templated(cfg.engine, prompt).model_copy(update={"label_logprobs": True})
    engine = build_engine(engine_cfg)
    spec = AnalyzeSpec(engine=engine_cfg, prompt_version=prompt, max_review_tokens=cfg.clean.max_review_tokens,
                       guard=cfg.prompt.guard)
    out: list[dict[str, Any]] = []
    try:
        for start in range(0, len(rows), cfg.engine.batch_size):
            part = rows.iloc[start : start + cfg.engine.batch_size]
            n = len(part)
            chunk = pd.DataFrame(
                {"review_id": range(start, start + n), "hotel_id": ["dev"] * n, "created_at": [None] * n,
                 "lang": part["lang"].tolist(), "text": part["text"].str.strip().tolist(),
                 "input_key": [f"k{i}" for i in range(n)], "clean_error": [None] * n},
                columns=CLEAN_SCHEMA.fieldNames(),
            )
            batch = PreparedBatch(engine, chunk, spec)
            batch.run_sync(engine)
            for j in range(n):
                out.append({"source_id": part["source_id"].iat[j], "lang": part["lang"].iat[j],
                            "gold": part["label"].iat[j],
                            "answer": batch.generated[j], "logprobs": batch.label_logprobs[j]})
            print(f"{len(out)}/{len(rows)} rows", flush=True)
    finally:
        engine.close()
    return out


def objective(gold: Sequence[str], answers: Sequence[str | None]) -> float:
    """Binary gold: accuracy; star gold: mean of accuracy and macro-F1 (as scoring.py scores them)."""
    classes = scheme(gold)
    if len(classes) == 2:
        return accuracy(gold, answers)
    return (accuracy(gold, answers) + macro_f1(per_class(gold, answers))) / 2


def fit(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, float], float, float]:
    """The bias of one language's rows with the best objective; the objective before and after.

    Binary gold (zh) says nothing about neutral (every such answer is wrong there, so it stays 0). Its positives
    are overall verdicts, which by the label definitions are not `mixed` even when they complain, so mixed gets a
    bias too, bounded at MIXED_FLOOR: a review the model calls mixed by a wider margin stays mixed (an unbounded
    fit would teach the model never to say it).
    """
    gold = [r["gold"] for r in rows]
    before = objective(gold, [r["answer"] for r in rows])
    best: tuple[float, float, dict[str, float]] = (before, 0.0, {})
    binary = len(scheme(gold)) == 2
    free = ("negative", "mixed") if binary else OTHERS
    grids = [FINE, [x for x in FINE if MIXED_FLOOR <= x <= 0]] if binary else [GRID] * len(OTHERS)
    for values in itertools.product(*grids):
        bias = dict(zip(free, values, strict=True))
        answers = [calibrated(r["answer"], r["logprobs"], bias) if r["answer"] else None for r in rows]
        score = objective(gold, answers)
        size = sum(abs(v) for v in values)
        if score > best[0] + 1e-9 or (abs(score - best[0]) <= 1e-9 and best[2] and size < best[1]):
            best = (score, size, bias)
    return best[2], before, best[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", default="v4")
    p.add_argument("--model", default="qwen2.5-coder-0.5b", help="engine.default_model")
    p.add_argument("--limit", type=int, default=400)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--refit", action="store_true", help="fit again on the rows of the last run's JSON")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override KEY=VALUE")
    args = p.parse_args()
    out = ROOT / "bench" / "results" / f"calibration_{args.prompt}_{args.model}.json"
    if args.refit:  # the rows an earlier run labelled, fitted again (a change of the fit, not of the model)
        earlier = json.loads(out.read_text(encoding="utf-8"))
        labelled, seconds = earlier["rows_detail"], earlier["seconds"]
    else:
        rows = fit_rows(args.limit, args.seed)
        t0 = time.perf_counter()
        labelled = label_rows(rows, args.prompt, [f"engine.default_model={args.model}", *args.overrides])
        seconds = time.perf_counter() - t0
    reported = sum(r["logprobs"] is not None for r in labelled)
    result: dict[str, Any] = {"prompt": args.prompt, "model": args.model, "rows": len(labelled),
                              "with_logprobs": reported, "seconds": round(seconds, 1), "label_bias": {}, "score": {}}
    for lang in sorted({r["lang"] for r in labelled}):
        mine = [r for r in labelled if r["lang"] == lang]
        bias, before, after = fit(mine)
        result["label_bias"][lang] = bias
        result["score"][lang] = {"before": round(before, 4), "after": round(after, 4), "rows": len(mine)}
        answers = [calibrated(r["answer"], r["logprobs"], bias) if r["answer"] else None for r in mine]
        classes = scheme([r["gold"] for r in mine])
        moved = sum(a != r["answer"] for a, r in zip(answers, mine, strict=True))
        print(f"{lang}: bias {bias}  score {before:.3f} -> {after:.3f} on {len(mine)} rows ({moved} labels moved; "
              f"scored as {scored('mixed', classes)} for mixed)")
    result["rows_detail"] = labelled
    out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows_detail"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
