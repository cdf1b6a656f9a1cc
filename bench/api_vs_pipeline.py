"""The public column function's throughput vs pipeline.analyse on the same rows (target >= 0.97), in one run.

    .venv/bin/python bench/api_vs_pipeline.py [--rows 64] [--repeats 3] [--model DIR] [--batch-size 32]

Both sides run in one local Spark application with the same config (conf/local.yaml: one engine slot of both
cores), so they share the Python worker's cached engine: what differs is only the path around it. Pipeline: the
job's transform (`clean` in Spark, `pipeline.analyse`: mapInPandas over the executor schema). API:
`qwenspark.analyze_reviews` on the raw DataFrame (the pandas UDF over the text and language columns, cleaning in
Python). Each side is collected to the driver (the answers' tokens_out). Warm-up first (engine load, every prompt
prefix seen once), then the order alternates and the median of each side is reported with every run.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench.alternate import alternate, arguments, demo_rows, report  # noqa: E402
from qwenspark.api import analyze_reviews  # noqa: E402
from qwenspark.clean import clean  # noqa: E402
from qwenspark.config import load_config  # noqa: E402
from qwenspark.pipeline import analyse  # noqa: E402
from qwenspark.schemas import INPUT_SCHEMA  # noqa: E402
from qwenspark.session import spark_session  # noqa: E402
from qwenspark.slots import plan_slots  # noqa: E402


def main() -> int:
    args = arguments(__doc__ or "", ROOT).parse_args()
    cfg = load_config(ROOT / "conf" / "local.yaml", [f"engine.model={args.model}", "engine.default_model=false",
                                                     f"engine.batch_size={args.batch_size}"])
    rows = demo_rows(ROOT, args.rows)

    spark = spark_session(cfg)
    raw = spark.createDataFrame(rows, INPUT_SCHEMA).cache()
    raw.count()
    plan = plan_slots(spark, cfg)

    def run_pipeline() -> tuple[float, int]:
        t0 = time.perf_counter()
        out = analyse(clean(raw, cfg), cfg, plan=plan).select("tokens_out").collect()
        assert len(out) == len(rows)
        return time.perf_counter() - t0, sum(r.tokens_out for r in out)

    def run_api() -> tuple[float, int]:
        t0 = time.perf_counter()
        out = analyze_reviews(raw, "text", "lang", config=cfg).select("analysis.tokens_out").collect()
        assert len(out) == len(rows)
        return time.perf_counter() - t0, sum(r.tokens_out for r in out)

    measured = alternate(("pipeline", run_pipeline), ("api", run_api), args.repeats)
    spark.stop()
    report("pipeline", "api", measured, args.json_out,
           rows=len(rows), model=Path(args.model).name,
           batch_size=args.batch_size, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
