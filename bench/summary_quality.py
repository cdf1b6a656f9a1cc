"""Summary quality on real reviews: how many summaries the grammar stopped at their bound, and how many copy the review.

The summary is bounded by the prompt version's grammar (v10: 100 characters); an answer still writing at the bound is
stopped mid-clause and stored ended at its last clause or word with "…" (qwenspark.parse.ended_summary). A summary
that is one stretch of the review word for word is a copy, not a summary. Reviews from the dev set (seeded sample per
language) go one per request to a running `qwenspark serve` (the product's path, as bench/aspect_quality.py):

    qwenspark serve --config conf/local.yaml --port 8077 &
    .venv/bin/python bench/summary_quality.py --url http://127.0.0.1:8077 --per-lang 30 --json-out OUT.json

Prints per language: answers, the share stopped at the bound (ended with "…"), the mean length, and the share whose
longest verbatim stretch of the review covers at least 80 % of the summary (case and spacing ignored).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.aspect_quality import DATA, ask  # noqa: E402

COPY_SHARE = 0.8  # a summary this much of which is one verbatim stretch of the review counts as a copy


def copied_share(summary: str, review: str) -> float:
    """The share of the summary (without a closing "…") that is its longest verbatim stretch of the review."""
    s, r = " ".join(summary.rstrip("…").lower().split()), " ".join(review.lower().split())
    if not s:
        return 0.0
    match = SequenceMatcher(None, s, r, autojunk=False).find_longest_match(0, len(s), 0, len(r))
    return match.size / len(s)


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-language figures of answered rows (lang, summary, review)."""
    n = len(rows)
    if not n:
        return {"answers": 0}
    return {
        "answers": n,
        "stopped_at_bound": round(sum(r["summary"].endswith("…") for r in rows) / n, 3),
        "mean_chars": round(sum(len(r["summary"]) for r in rows) / n, 1),
        "copies": round(sum(r["copied"] >= COPY_SHARE for r in rows) / n, 3),
        "mean_copied_share": round(sum(r["copied"] for r in rows) / n, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8060", help="a running qwenspark serve")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--per-lang", type=int, default=30)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    dev = pd.read_csv(args.data, usecols=["source_id", "lang", "text"])
    sample = pd.concat([dev[dev.lang == lang].sample(args.per_lang, random_state=args.seed) for lang in ("en", "zh")])
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(ask, [args.url] * len(sample), sample["text"], sample["lang"]))
    rows = [{"source_id": s, "lang": lang, "summary": r["summary"], "review": text,
             "copied": round(copied_share(r["summary"], text), 3)}
            for s, lang, text, r in zip(sample["source_id"], sample["lang"], sample["text"], results, strict=True)
            if r.get("summary")]
    report = {
        "url": args.url, "model": results[0].get("model"), "prompt_version": results[0].get("prompt_version"),
        "seconds": round(time.monotonic() - t0, 1), "failed": len(results) - len(rows),
        "by_lang": {lang: figures([r for r in rows if r["lang"] == lang]) for lang in ("en", "zh")},
        "answers": [{k: v for k, v in r.items() if k != "review"} for r in rows],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "answers"}, ensure_ascii=False, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
