"""The shortest labelled dev reviews per language as a CSV for `qwenspark eval`: where a small model, given little to
summarise, fills its summary from the prompt's few-shot answers (README, "Summary borrowed").

    .venv/bin/python bench/shortest_reviews.py --per-lang 100 --out /tmp/short200.csv
    .venv/bin/qwenspark eval --config conf/local.yaml --input /tmp/short200.csv --out R.json

Rows of the eval samples used to choose prompts and to report on them (--limit 120 --seed 3, --limit 600 --seed 11)
are left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.evaluate import sample  # noqa: E402

DEV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEV)
    ap.add_argument("--per-lang", type=int, default=100)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    df = pd.read_csv(args.data, dtype=str, keep_default_na=False)
    used = set(sample(df, 120, 3)["source_id"]) | set(sample(df, 600, 11)["source_id"])
    rest = df[~df["source_id"].isin(used)].assign(chars=lambda d: d["text"].str.len())
    langs = sorted(rest["lang"].unique())
    short = pd.concat([rest[rest["lang"] == lang].nsmallest(args.per_lang, "chars") for lang in langs])
    short.drop(columns="chars").to_csv(args.out, index=False)
    print(short.groupby("lang")["chars"].describe()[["count", "min", "50%", "max"]].to_string())


if __name__ == "__main__":
    main()
