"""Spark pipeline throughput vs the bare engine on the same rows (target >= 0.97), measured in one run.

    .venv/bin/python bench/spark_vs_bare.py [--rows 96] [--model DIR] [--batch-size 32]

Bare: the engine in this process, one `generate` over all prompts. Spark: `pipeline.analyse()` through
mapInPandas in local mode (one partition, so one engine, as conf/local.yaml runs it), after a warm-up that
loads the engine in the Python worker. Same rows, same engine config; wall time of each, no model loading.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from qwenspark.clean import clean  # noqa: E402
from qwenspark.config import load_config  # noqa: E402
from qwenspark.engines import cache  # noqa: E402
from qwenspark.pipeline import analyse  # noqa: E402
from qwenspark.prompts import detect_lang, get_template  # noqa: E402
from qwenspark.schemas import INPUT_SCHEMA  # noqa: E402
from qwenspark.session import spark_session  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--model", default=str(ROOT / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct"))
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    cfg = load_config(
        ROOT / "conf" / "local.yaml",
        [f"engine.model={args.model}", "engine.default_model=false", f"engine.batch_size={args.batch_size}"],
    )
    import pandas as pd

    demo = pd.read_csv(ROOT / "data" / "demo" / "hotel_reviews_demo.csv", dtype=str, keep_default_na=False)
    demo = demo[(demo["text"].str.strip() != "") & (demo["text"].str.len() < 1500)].head(args.rows)
    triples = zip(demo.hotel_id, demo.lang, demo.text, strict=True)
    rows = [(i, h, None, lang, None, t) for i, (h, lang, t) in enumerate(triples)]

    spark = spark_session(cfg)
    df = clean(spark.createDataFrame(rows, INPUT_SCHEMA), cfg).cache()
    df.count()
    analyse(df.limit(2), cfg).collect()  # warm-up: the engine loads in the Python worker
    t0 = time.perf_counter()
    out = analyse(df, cfg).select("review_id", "tokens_out").collect()
    spark_s = time.perf_counter() - t0
    spark.stop()
    assert len(out) == len(rows)

    engine, _ = cache.get_engine(cfg.engine)
    template = get_template(cfg.prompt.version)
    conversations = [template.messages(t, detect_lang(t, lang)) for _, _, _, lang, _, t in rows]
    engine.generate(conversations[:2])
    t0 = time.perf_counter()
    bare = engine.generate(conversations)
    bare_s = time.perf_counter() - t0
    figures = {
        "rows": len(rows), "model": Path(args.model).name, "batch_size": args.batch_size,
        "spark_s": round(spark_s, 2), "bare_s": round(bare_s, 2),
        "spark_tokens": sum(r.tokens_out for r in out), "bare_tokens": sum(c.tokens_out for c in bare),
        "spark_vs_bare_rows": round(bare_s / spark_s, 3),
    }
    print(f"Spark pipeline vs bare engine, {len(rows)} rows: {figures['spark_vs_bare_rows']} (target >= 0.97)")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
