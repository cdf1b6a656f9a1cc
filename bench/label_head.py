"""Fit a label head (qwenspark.label_head) for a prompt version and model, on dev rows that no report is made on.

    .venv/bin/python bench/label_head.py --labels bench/results/calibration_v9_qwen2.5-coder-0.5b.json \
        --name h1-qwen2.5-coder-0.5b

Rows (../shared/data/hotel_reviews/reviews_dev.csv), per language:
- held out: the 600-row report sample (seed 11, drawn after the 120-row choosing sample of seed 3) is never read;
- stack rows: the rows of --labels, which bench/calibrate.py labelled with the model (its answers and label
  log-probabilities under the prompt version: `bench/calibrate.py --prompt v9 --limit 800 --seed 5`);
- lexical rows: every other dev row.
The lexical model's regularisation C is chosen by 5-fold cross-validation on the lexical rows. It is fitted on the
lexical rows, so its log-probabilities on the stack rows are out of sample, as they will be on new reviews; the
stack (weight, per-label bias, one-hot margin) is searched on a grid on the stack rows for the language's objective
(zh binary accuracy; en the mean of 3-class accuracy and macro-F1, as qwenspark/scoring.py scores them), ties to the
smallest parameters. The lexical model is then refitted on lexical + stack rows and the head written to
qwenspark/heads/<name>.npz. Prints the stack rows' scores for the model alone, the lexical model alone and the head.
The report on held-out rows is `qwenspark eval` of the prompt version that names the head (bench/eval_grid.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.sparse import csr_matrix
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from calibrate import DEV, HELD_OUT, MIXED_FLOOR, objective  # noqa: E402

from qwenspark.evaluate import load_labelled  # noqa: E402
from qwenspark.label_head import (  # noqa: E402
    HASH_BITS,
    HEADS,
    LanguageHead,
    Lexical,
    Stack,
    _lexical_score,
    _model_scores,
    hashed,
    save_head,
)
from qwenspark.schemas import SENTIMENTS  # noqa: E402

C_GRID = (2.0, 4.0, 8.0, 16.0, 32.0)
WEIGHT_STEP = 0.5  # the lexical weight's grid: 0 .. --max-weight
STAR_BIAS = [x / 2 for x in range(-4, 11)]  # -2 .. 5
BINARY_BIAS = [x / 4 for x in range(-16, 17)]  # -4 .. 4, negative under binary gold
MIDDLE_BIAS = [x / 4 for x in range(int(MIXED_FLOOR * 4), 1)]  # neutral/mixed under binary gold: floor .. 0
MARGINS = (0.5, 1.0, 2.0, 3.0, 4.0, 6.0)


def matrix(texts: Sequence[str], lang: str) -> tuple[csr_matrix, np.ndarray]:
    """Sublinear tf of hashed n-grams (rows) and the smooth idf of these texts."""
    indptr, indices, data = [0], [], []
    for text in texts:
        ids, tf = hashed(text, lang)
        indices.append(ids)
        data.append(tf)
        indptr.append(indptr[-1] + len(ids))
    shape = (len(texts), 1 << HASH_BITS)
    x = csr_matrix((np.concatenate(data), np.concatenate(indices), np.array(indptr)), shape=shape)
    df = np.bincount(x.indices, minlength=x.shape[1])
    idf = np.log((1 + x.shape[0]) / (1 + df)) + 1.0
    return x, idf.astype(np.float32)


def weighted(x: csr_matrix, idf: np.ndarray) -> csr_matrix:
    """tf * idf, each row L2-normalised (as Lexical.log_proba computes it; idf rounded to float16 as stored)."""
    idf = idf.astype(np.float16).astype(np.float32)
    y = x.multiply(idf[None, :]).tocsr()
    norms = np.sqrt(np.asarray(y.multiply(y).sum(axis=1))).ravel()
    norms[norms == 0] = 1.0
    return csr_matrix(y.multiply(1.0 / norms[:, None]))


def fit_lexical(texts: Sequence[str], gold: Sequence[str], lang: str, c: float) -> Lexical:
    """The lexical model on these rows (class weights balanced: the stack's bias sets the prior)."""
    x, idf = matrix(texts, lang)
    model = LogisticRegression(C=c, max_iter=5000, class_weight="balanced").fit(weighted(x, idf), list(gold))
    coef = model.coef_.astype(np.float16).astype(np.float32)  # as stored
    return Lexical(classes=tuple(str(c) for c in model.classes_), idf=idf, coef=coef,
                   intercept=model.intercept_.astype(np.float64))


def choose_c(texts: Sequence[str], gold: Sequence[str], lang: str) -> tuple[float, dict[float, float]]:
    """C with the best 5-fold cross-validated objective on the lexical rows."""
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=0)
    texts, gold_arr = list(texts), np.array(gold)
    scores: dict[float, float] = {}
    for c in C_GRID:
        predicted: list[str] = [""] * len(texts)
        for train, test in folds.split(texts, gold_arr):
            lexical = fit_lexical([texts[i] for i in train], gold_arr[train].tolist(), lang, c)
            for i in test:
                lp = lexical.log_proba(texts[i], lang)
                predicted[i] = max(lp, key=lambda k: lp[k])
        scores[c] = round(objective(gold_arr.tolist(), predicted), 4)
        print(f"  {lang} C={c}: cross-validated objective {scores[c]:.4f}", flush=True)
    return max(C_GRID, key=lambda c: (scores[c], -c)), scores


def fit_stack(gold: Sequence[str], model: np.ndarray, lexical: np.ndarray, binary: bool,
              margins: Sequence[float], *, max_weight: float = 6.0) -> tuple[Stack, float]:
    """The (weight, bias, margin) with the best objective; model/lexical: [rows, labels] scores in SENTIMENTS order.

    With margins, model holds one-hot answers (1 for the answer) that the margin scales to 0 / -margin.
    """
    free = ("negative", "neutral", "mixed")
    grids = [BINARY_BIAS, MIDDLE_BIAS, MIDDLE_BIAS] if binary else [STAR_BIAS] * 3
    index = [SENTIMENTS.index(label) for label in free]
    codes = np.array([SENTIMENTS.index(g) for g in gold])
    best: tuple[float, float, Stack] | None = None
    for margin in margins or (0.0,):
        base = (model - 1.0) * margin if margins else model
        for weight in np.arange(0.0, max_weight + 1e-9, WEIGHT_STEP).tolist():
            combined = base + weight * lexical
            for values in itertools.product(*grids):
                bias = np.zeros(len(SENTIMENTS))
                bias[index] = values
                score = fast_objective(codes, np.argmax(combined + bias, axis=1), binary)
                size = weight + sum(abs(v) for v in values) + margin / 10
                if best is None or score > best[0] + 1e-9 or (abs(score - best[0]) <= 1e-9 and size < best[1]):
                    stack = Stack(weight=weight, bias={k: v for k, v in zip(free, values, strict=True) if v},
                                  margin=margin)
                    best = (score, size, stack)
    assert best is not None
    return best[2], best[0]


MIDDLE, MIXED = SENTIMENTS.index("neutral"), SENTIMENTS.index("mixed")


def fast_objective(gold: np.ndarray, predicted: np.ndarray, binary: bool) -> float:
    """calibrate.objective on label codes (SENTIMENTS indices), vectorised for the grid (a test holds them equal)."""
    if binary:
        return float(np.mean(gold == predicted))
    predicted = np.where(predicted == MIXED, MIDDLE, predicted)  # mixed scores as neutral under star gold
    accuracy = float(np.mean(gold == predicted))
    f1s = []
    for label in np.unique(gold):
        tp = float(np.sum((gold == label) & (predicted == label)))
        precision = tp / max(float(np.sum(predicted == label)), 1.0)
        recall = tp / float(np.sum(gold == label))
        f1s.append(round(2 * precision * recall / (precision + recall), 4) if precision + recall else 0.0)
    return (accuracy + sum(f1s) / len(f1s)) / 2


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labels", type=Path, required=True, help="bench/calibrate.py's JSON: the stack rows")
    p.add_argument("--name", required=True, help="the head's name: qwenspark/heads/<name>.npz")
    p.add_argument("--max-weight", type=float, default=6.0,
                   help="the lexical weight's grid bound (6 for h1-qwen2.5-coder-0.5b; 10 for the 1.5B's, whose "
                        "confident Chinese `mixed` needs more lexical weight to be overruled)")
    args = p.parse_args()
    labelled = json.loads(args.labels.read_text(encoding="utf-8"))
    stack_rows = pd.DataFrame(labelled["rows_detail"])
    n, s, before = HELD_OUT
    held = set(load_labelled(DEV, n, s, exclude=before)["source_id"])
    dev = load_labelled(DEV, None)
    if held & set(stack_rows["source_id"]):
        raise SystemExit("the stack rows include held-out report rows")
    text_of = dict(zip(dev["source_id"], dev["text"].str.strip(), strict=True))
    report: dict[str, Any] = {"labels": str(args.labels.resolve().relative_to(ROOT)), "prompt": labelled["prompt"],
                              "model": labelled["model"], "languages": {}}
    heads: dict[str, LanguageHead] = {}
    for lang in sorted(stack_rows["lang"].unique()):
        mine = stack_rows[stack_rows["lang"] == lang].reset_index(drop=True)
        lex_rows = dev[(dev["lang"] == lang) & ~dev["source_id"].isin(held | set(mine["source_id"]))]
        lex_texts, lex_gold = lex_rows["text"].str.strip().tolist(), lex_rows["label"].tolist()
        c, cv = choose_c(lex_texts, lex_gold, lang)
        lexical = fit_lexical(lex_texts, lex_gold, lang, c)
        gold = mine["gold"].tolist()
        texts = [text_of[sid] for sid in mine["source_id"]]
        lex_lp = [lexical.log_proba(t, lang) for t in texts]
        lex = np.array([[_lexical_score(label, lp) for label in SENTIMENTS] for lp in lex_lp])
        reported = [lp if isinstance(lp, dict) and lp else None for lp in mine["logprobs"]]
        answers = mine["answer"].tolist()
        model = np.array([
            [(_model_scores(lp) if lp else {a: 0.0})
             .get(label, -20.0) for label in SENTIMENTS] for lp, a in zip(reported, answers, strict=True)
        ])
        onehot = np.array([[1.0 if label == a else 0.0 for label in SENTIMENTS] for a in answers])
        binary = "neutral" not in gold
        with_lp, with_score = fit_stack(gold, model, lex, binary, (), max_weight=args.max_weight)
        without_lp, without_score = fit_stack(gold, onehot, lex, binary, MARGINS, max_weight=args.max_weight)
        lexical_only = [max(lp, key=lambda k: lp[k]) for lp in lex_lp]
        heads[lang] = LanguageHead(lexical=fit_lexical(lex_texts + texts, lex_gold + gold, lang, c),
                                   with_logprobs=with_lp, without_logprobs=without_lp)
        figures = {
            "stack_rows": len(mine), "lexical_rows": len(lex_rows), "lexical_c": c, "cv": cv,
            "model_alone": round(objective(gold, [a or None for a in answers]), 4),
            "lexical_alone": round(objective(gold, lexical_only), 4),
            "head_with_logprobs": round(with_score, 4), "head_without_logprobs": round(without_score, 4),
            "with_logprobs": {"weight": with_lp.weight, "bias": dict(with_lp.bias)},
            "without_logprobs": {"weight": without_lp.weight, "bias": dict(without_lp.bias),
                                 "margin": without_lp.margin},
        }
        report["languages"][lang] = figures
        print(f"{lang}: objective on the {len(mine)} stack rows: model {figures['model_alone']:.3f}, lexical "
              f"{figures['lexical_alone']:.3f}, head {with_score:.3f} (without log-probabilities {without_score:.3f})",
              flush=True)
    report["max_weight"] = args.max_weight
    provenance = {k: report[k] for k in ("labels", "prompt", "model", "max_weight")} | {
        "held_out": f"{n} rows, seed {s}, excluding {before}",
        "fit": {lang: {k: v for k, v in f.items() if k in ("stack_rows", "lexical_rows", "lexical_c")}
                for lang, f in report["languages"].items()},
    }
    save_head(HEADS / f"{args.name}.npz", heads, provenance)
    out = ROOT / "bench" / "results" / f"label_head_{args.name}.json"
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
