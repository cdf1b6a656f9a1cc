"""A prompt x model grid of `qwenspark eval` runs on one fixed dev sample, as one table.

    .venv/bin/python bench/eval_grid.py [--limit 120] [--seed 3] [--prompts v1,v4] [--models qwen2.5-coder-0.5b,...]
        [--reuse]

Each cell is one `qwenspark eval` (the whole pipeline through Spark, the same seeded sample of the labelled dev
reviews in ../shared/data/hotel_reviews, split evenly between zh and en) with --set prompt.version=P and, for a
model other than the default, --set engine.default_model=M; its JSON goes to bench/results/eval/<P>_<M>_n<N>_s<S>.json
(compare two with `qwenspark eval --compare A.json B.json`). Prints the table and writes
bench/results/eval_grid_n<N>_s<S>.json. --exclude-sample 120:3 reports on rows that sample did not hold.
The labels' scoring: qwenspark/scoring.py (README, "Labels and how they are scored").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.report import dig  # noqa: E402

DEV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"
OUT = ROOT / "bench" / "results" / "eval"
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
COLUMNS = [("zh acc", ("accuracy_by_lang", "zh")), ("en acc", ("accuracy_by_lang", "en")),
           ("en macro-F1", ("macro_f1_by_lang", "en")), ("valid", ("schema_valid_rate",)),
           ("cut/loop", ("cut_or_looping_rate",)), ("summ. lang", ("summary_in_language_rate",)),
           ("summ. copied", ("summary_copied_rate",)), ("summ. borrow", ("summary_borrowed_rate",)),
           ("tok/review", ("mean_tokens_out",)), ("rows/s", ("rows_per_s",))]


def run_cell(prompt: str, model: str, sample: tuple[int, int, list[str]], extra: list[str], *,
             reuse: bool) -> dict[str, Any]:
    """One eval run of sample (limit, seed, excluded N:SEED samples); its report (also left in OUT). reuse: a report
    already in OUT for the same sample is taken."""
    limit, seed, exclude = sample
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{prompt}_{model}_n{limit}_s{seed}.json"
    if reuse and out.is_file():
        kept: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        if kept.get("rows") == limit:
            return kept
    sets = [f"prompt.version={prompt}", *extra]
    if model != DEFAULT_MODEL:
        sets += [f"engine.default_model={model}", f"engine.model=.cache/models/{model}-instruct"]
    cmd = [sys.executable, "-m", "qwenspark.cli", "-q", "eval", "--config", str(ROOT / "conf" / "local.yaml"),
           "--input", str(DEV), "--limit", str(limit), "--seed", str(seed), "--out", str(out),
           *(f"--exclude-sample={x}" for x in exclude),
           *(f"--set={s}" for s in sets)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=120)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--prompts", default="v1,v4")
    parser.add_argument("--models", default=DEFAULT_MODEL)
    parser.add_argument("--set", dest="extra", action="append", default=[], help="more config overrides")
    parser.add_argument("--reuse", action="store_true", help="take cells already in bench/results/eval (same size)")
    parser.add_argument("--exclude-sample", action="append", default=[], metavar="N:SEED",
                        help="leave out the rows of that sample (the one prompts and models were chosen on)")
    args = parser.parse_args()
    sample = (args.limit, args.seed, args.exclude_sample)
    cells = {(p, m): run_cell(p, m, sample, args.extra, reuse=args.reuse)
             for m in args.models.split(",") for p in args.prompts.split(",")}
    print(f"\n{args.limit} dev rows (seed {args.seed}; excluded: {args.exclude_sample or 'none'})")
    print(f"{'prompt':8}{'model':22}" + "".join(f"{name:>12}" for name, _ in COLUMNS))
    table = []
    for (prompt, model), report in cells.items():
        values = {name: dig(report, path) for name, path in COLUMNS}
        table.append({"prompt": prompt, "model": model, **values})
        print(f"{prompt:8}{model:22}" + "".join(
            f"{v:>12.3f}" if isinstance(v, float) else f"{v!s:>12}" for v in values.values()))
    grid = ROOT / "bench" / "results" / f"eval_grid_n{args.limit}_s{args.seed}.json"
    # Cells of an earlier run of the same sample stay in the table unless this run measured them again.
    earlier = json.loads(grid.read_text(encoding="utf-8")) if grid.exists() else {}
    if earlier.get("excluded") == args.exclude_sample and earlier.get("sets") == args.extra:
        fresh = {(row["prompt"], row["model"]) for row in table}
        table = [row for row in earlier.get("table", []) if (row["prompt"], row["model"]) not in fresh] + table
    result = {"limit": args.limit, "seed": args.seed, "excluded": args.exclude_sample, "sets": args.extra,
              "table": table}
    grid.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
