"""The shortest labelled dev reviews per language as a CSV for `qwenspark eval`: where a small model, given little to
summarise, fills its summary from the prompt's few-shot answers (README, "Summary borrowed").

    .venv/bin/python bench/shortest_reviews.py --per-lang 100 --out /tmp/short200.csv
    .venv/bin/qwenspark eval --config conf/local.yaml --input /tmp/short200.csv --out R.json

The rows of `--limit 120 --seed 3` and `--limit 600 --seed 11`, each as drawn from the whole CSV, are left out
(qwenspark.evaluate.load_labelled's exclude). The held-out report's 600 rows are drawn after the first sample is left
out, so they are not those: 27 of the 200 shortest are among them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.eval_grid import DEV  # noqa: E402
from qwenspark.evaluate import load_labelled  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEV)
    ap.add_argument("--per-lang", type=int, default=100)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rest = load_labelled(args.data, None, exclude=[(120, 3), (600, 11)]).assign(chars=lambda d: d["text"].str.len())
    short = pd.concat([rows.nsmallest(args.per_lang, "chars") for _, rows in rest.groupby("lang")])
    short.drop(columns="chars").to_csv(args.out, index=False)
    print(short.groupby("lang")["chars"].describe()[["count", "min", "50%", "max"]].to_string())


if __name__ == "__main__":
    main()
