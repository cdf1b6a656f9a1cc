"""Aspect quality against hand-marked reviews: does the answer name the aspects the review talks about, and only those?

The dev set has sentiment labels only. `bench/data/aspects_gold.jsonl` marks, for 40 of its reviews (20 en, 20 zh,
`reviews_dev.csv` sampled with seed 43 per language), which of `qwenspark.schemas.ASPECTS` each one talks about
(presence only, not the aspect's sentiment; marked by a session of this project reading each review whole: room =
the room itself, its size, bed, bathroom, view; facilities = equipment and amenities, AC, hot water, TV, internet,
pool, parking, lobby). The reviews go one per request to a running `qwenspark serve` (the product's path: prompt,
grammar, parsing as the batch job), and each answer's aspects are scored against the marks:

    qwenspark serve --config conf/local.yaml --port 8077 &
    .venv/bin/python bench/aspect_quality.py --url http://127.0.0.1:8077 --json-out bench/results/aspects_cpu.json

The service stores only the aspects the review has a cue word of (prompt.aspect_evidence, on by default since stop
44); `--set prompt.aspect_evidence=false` on `qwenspark serve` scores the model's aspects as it names them.

Prints micro precision / recall / F1 over (review, aspect) pairs, per aspect, and how many aspects an answer names
against how many the review talks about.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from qwenspark.schemas import ASPECTS
from qwenspark.scoring import mentions

ROOT = Path(__file__).resolve().parents[1]
GOLD = ROOT / "bench" / "data" / "aspects_gold.jsonl"
DATA = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"


def load(gold: Path, data: Path) -> pd.DataFrame:
    """The marked reviews with their text: source_id, lang, text, aspects (the marks)."""
    marks = pd.read_json(gold, lines=True)
    texts = pd.read_csv(data, usecols=["source_id", "text"])
    out = marks.merge(texts, on="source_id", how="left")
    missing = out[out["text"].isna()]["source_id"].tolist()
    if missing:
        raise SystemExit(f"{len(missing)} marked reviews are not in {data}: {missing[:5]}")
    return out


def ask(url: str, text: str, lang: str, tries: int = 3) -> dict[str, Any]:
    """One review's result from the service; a 429 or 504 is asked again (this CPU is slow) and after the last try
    reported as the answer's error; anything else is raised."""
    body = json.dumps({"text": text, "lang": lang}).encode()
    for _ in range(tries):
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/analyze", data=body), timeout=600) as r:
                result: dict[str, Any] = json.load(r)["results"][0]
                return result
        except urllib.error.HTTPError as e:
            if e.code not in (429, 504):
                raise
            error = f"HTTP {e.code}"
            time.sleep(1)
    return {"error": error}


def score(marked: list[set[str]], named: list[set[str] | None]) -> dict[str, Any]:
    """Micro precision / recall / F1 over (review, aspect) pairs (qwenspark.scoring.mentions), overall and per
    aspect; answers that failed (None) count as naming none."""

    def only(aspect: str, answers: list[set[str] | None]) -> list[set[str] | None]:
        return [None if s is None else s & {aspect} for s in answers]

    overall = asdict(mentions(marked, named))
    return {
        **{k: overall[k] for k in ("precision", "recall", "f1")},
        "reviews": len(marked),
        "answers_failed": sum(g is None for g in named),
        "mean_aspects_marked": round(sum(map(len, marked)) / len(marked), 2),
        "mean_aspects_named": round(sum(len(g or ()) for g in named) / len(named), 2),
        "per_aspect": {a: asdict(mentions([s & {a} for s in marked], only(a, named))) for a in ASPECTS
                       if any(a in s for s in [*marked, *(n or set() for n in named)])},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8060", help="a running qwenspark serve")
    p.add_argument("--gold", type=Path, default=GOLD)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    rows = load(args.gold, args.data)
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(ask, [args.url] * len(rows), rows["text"], rows["lang"]))
    named = [None if r.get("error") else {m["aspect"] for m in r["aspects"]} for r in results]
    report = {
        "url": args.url,
        "model": results[0].get("model"),
        "prompt_version": results[0].get("prompt_version"),
        "seconds": round(time.monotonic() - t0, 1),
        **score([set(a) for a in rows["aspects"]], named),
        "answers": [{"source_id": s, "marked": sorted(a), "named": sorted(n) if n is not None else None}
                    for s, a, n in zip(rows["source_id"], rows["aspects"], named, strict=True)],
    }
    print(json.dumps({k: v for k, v in report.items() if k != "answers"}, ensure_ascii=False, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()
