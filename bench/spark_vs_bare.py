"""Spark pipeline throughput vs the bare engine on the same rows (target >= 0.97), measured in one run.

    .venv/bin/python bench/spark_vs_bare.py [--rows 64] [--repeats 3] [--model DIR] [--batch-size 32]

Fair by construction: both sides run the SAME executor function (`analyze.make_analyze_fn`: the same engine
settings, batch size, continuous feeding, prompts and parsing) with the SAME thread settings (2 threads on cores
0-1 on this machine). Bare: that function called in this process on the pandas rows. Spark: `pipeline.analyse()`
through mapInPandas in local mode (one engine slot, as conf/local.yaml runs it), collected. Both engines are
loaded and warmed before timing; the order alternates (bare, spark, spark, bare, ...) and the median of each
side is reported with every run, so a noisy neighbour on the shared cores shows up instead of hiding.
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
from qwenspark.analyze import AnalyzeSpec, make_analyze_fn  # noqa: E402
from qwenspark.clean import clean  # noqa: E402
from qwenspark.config import load_config  # noqa: E402
from qwenspark.pipeline import analyse  # noqa: E402
from qwenspark.schemas import INPUT_SCHEMA  # noqa: E402
from qwenspark.session import spark_session  # noqa: E402
from qwenspark.slots import plan_slots  # noqa: E402
from qwenspark.stream import probe  # noqa: E402


def main() -> int:
    args = arguments(__doc__ or "", ROOT).parse_args()
    cores = len(os.sched_getaffinity(0))
    cfg = load_config(
        ROOT / "conf" / "local.yaml",
        [f"engine.model={args.model}", "engine.default_model=false", f"engine.batch_size={args.batch_size}",
         # Both engines on the same cores with the same threads (each side would otherwise claim its own).
         f"engine.env.VLLM_CPU_OMP_THREADS_BIND=0-{cores - 1}", f"engine.env.OMP_NUM_THREADS={cores}"],
    )
    rows = demo_rows(ROOT, args.rows)

    spark = spark_session(cfg)
    df = clean(spark.createDataFrame(rows, INPUT_SCHEMA), cfg).cache()
    frame = df.toPandas()
    plan = plan_slots(spark, cfg)
    spec = AnalyzeSpec(engine=cfg.engine, prompt_version=cfg.prompt.version,
                       max_review_tokens=cfg.clean.max_review_tokens, cores=plan.cores_per_slot)
    bare_fn = make_analyze_fn(spec)

    import pandas as pd

    def run_bare() -> tuple[float, int]:
        # Untimed: a one-row Python task, so that Spark's worker factory (which stops Python workers idle for a
        # minute) keeps the Spark side's engine through two bare runs in a row; unfair to Spark otherwise.
        probe(spark)
        t0 = time.perf_counter()
        out = pd.concat(list(bare_fn(iter([frame]))))
        return time.perf_counter() - t0, int(out["tokens_out"].sum())

    def run_spark() -> tuple[float, int]:
        t0 = time.perf_counter()
        out = analyse(df, cfg, plan=plan).select("tokens_out").collect()
        assert len(out) == len(rows)
        return time.perf_counter() - t0, sum(r.tokens_out for r in out)

    # Warm-up inside: both engines load (the Spark one in its Python worker) and see every prompt prefix once.
    measured = alternate(("bare", run_bare), ("spark", run_spark), args.repeats)
    spark.stop()
    report("bare", "spark", measured, args.json_out,
           rows=len(rows), model=Path(args.model).name, batch_size=args.batch_size,
           cores=cores, repeats=args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
