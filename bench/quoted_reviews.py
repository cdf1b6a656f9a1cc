"""Reviews that quote someone with ASCII double quotes, and whether their summaries end where the quote began.

A summary that copies a guest's quotation copied the review's quote mark, and an ASCII one closed the summary's JSON
string (or v13's quoted line): "...经理的回复是" and nothing more (README, "A guest's quotation"; since stop 57 the
review is shown with typographic quotes, qwenspark.prompts.typographic_quotes). Two steps, `qwenspark eval` between:

    .venv/bin/python bench/quoted_reviews.py csv --out /tmp/quoted.csv          # the demo's reviews with a " in them
    .venv/bin/qwenspark eval --config conf/local.yaml --input /tmp/quoted.csv --rows-out /tmp/quoted_rows.csv
    .venv/bin/python bench/quoted_reviews.py score /tmp/quoted_rows.csv

`score` counts the summaries that end without a sentence's end or the bound's "…": the cut ones (a Chinese summary
may end without 。 on its own, so compare two runs rather than read one count alone).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "demo" / "hotel_reviews_demo.csv"
ENDS = tuple(".!?。！？…🙂")


def quoted(data: Path) -> pd.DataFrame:
    """The demo's reviews that hold an ASCII double quote, as a labelled CSV for `qwenspark eval` (hand labels)."""
    demo = pd.read_csv(data, dtype=str, keep_default_na=False)
    rows = demo[demo["text"].str.contains('"', regex=False) & (demo["expected_sentiment"] != "")]
    return pd.DataFrame({"source_id": "demo-" + rows["review_id"], "lang": rows["lang"], "text": rows["text"],
                         "rating": rows["rating"], "label": rows["expected_sentiment"]})


def unended(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of an `eval --rows-out` CSV whose summary ends without a sentence's end or "…"."""
    summaries = rows["summary"].fillna("").str.rstrip()
    return rows[~summaries.str.endswith(ENDS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    make = sub.add_parser("csv", help="write the demo's quoting reviews as a labelled CSV")
    make.add_argument("--data", type=Path, default=DEMO)
    make.add_argument("--out", type=Path, required=True)
    score = sub.add_parser("score", help="count the summaries of an eval --rows-out CSV that end unfinished")
    score.add_argument("rows", type=Path)
    args = ap.parse_args()
    if args.step == "csv":
        out = quoted(args.data)
        out.to_csv(args.out, index=False)
        print(f"{len(out)} reviews with an ASCII double quote: {out['lang'].value_counts().to_dict()}")
        return
    rows = pd.read_csv(args.rows, dtype=str, keep_default_na=False)
    cut = unended(rows)
    print(f"{len(cut)} of {len(rows)} summaries end unfinished")
    for r in cut.itertuples(index=False):
        print(f"  {r.source_id}: ...{r.summary[-40:]}")


if __name__ == "__main__":
    main()
