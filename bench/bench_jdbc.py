"""JDBC read and staged upsert throughput on 100k reviews (real Spark, real MariaDB; no model).

    make bench            # or: .venv/bin/python bench/bench_jdbc.py [--rows 100000]

Starts its own throwaway MariaDB (.run/bench-mariadb, port 13398), fills hotel_reviews, then times:
the partitioned JDBC read, the staging write, the commit of the staged rows (mysql.commit_run: the upsert into
review_sentiment and the aggregate maintenance, in transactions of sink.commit_chunk_rows staged rows) and a
replay of the same run (which must change 0 rows). Prints rows/s measured in this one run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pyspark.sql import functions as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.config import load_config  # noqa: E402
from qwenspark.io import grants, jdbc, migrate, mysql  # noqa: E402
from qwenspark.session import spark_session  # noqa: E402

DB_DIR, DB_PORT = ROOT / ".run" / "bench-mariadb", 13398


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--chunk-rows", type=int, default=None, help="sink.commit_chunk_rows (default: the config's)")
    args = parser.parse_args()
    env = {**os.environ, "MARIADB_DIR": str(DB_DIR), "MARIADB_PORT": str(DB_PORT)}
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "start"], check=True, env=env)
    cfg = load_config(
        ROOT / "conf" / "local.yaml",
        [f"db.port={DB_PORT}", f"db.password_file={DB_DIR / 'qwenspark.password'}", "engine.default_model=false",
         f"db.admin_password_file={DB_DIR / 'qwenspark-admin.password'}",
         *([f"sink.commit_chunk_rows={args.chunk_rows}"] if args.chunk_rows else [])],
    )
    migrate.migrate(cfg.db)
    grants.apply(cfg)
    # hotel_reviews is the application's: emptied and filled as the schema owner (the job may only read it).
    owner = cfg.model_copy(update={"db": cfg.db.owner()})
    with mysql.connect(owner.db, autocommit=True) as conn, conn.cursor() as cur:
        for table in ("hotel_reviews", "review_sentiment", "review_sentiment_stage", "hotel_sentiment_daily",
                      "aspect_sentiment", "sentiment_daily_lang", "aspect_daily_lang"):
            cur.execute(f"DELETE FROM {table}")
    spark = spark_session(cfg)
    n = args.rows
    reviews = spark.range(1, n + 1).select(
        F.col("id").alias("review_id"),
        F.format_string("H%03d", F.col("id") % 50).alias("hotel_id"),
        (F.lit("2026-11-01").cast("timestamp") + F.make_interval(mins=(F.col("id") % 40000).cast("int")))
        .alias("created_at"),
        F.when(F.col("id") % 2 == 0, "zh").otherwise("en").alias("lang"),
        (F.col("id") % 5 + 1).cast("int").alias("rating"),
        F.when(F.col("id") % 2 == 0, F.repeat(F.lit("房间干净，早餐不错，就是有点吵。"), 6))
        .otherwise(F.repeat(F.lit("Great location, tiny room, friendly staff. "), 5)).alias("text"),
    )
    figures: dict[str, float] = {}

    t0 = time.perf_counter()
    reviews.write.format("jdbc").options(**jdbc.jdbc_options(owner)).option("dbtable", "hotel_reviews") \
        .option("batchsize", "2000").mode("append").save()
    figures["JDBC write hotel_reviews"] = n / (time.perf_counter() - t0)

    lo, hi, selected = jdbc.id_bounds(cfg)
    assert selected == n
    t0 = time.perf_counter()
    total_chars = jdbc.read_reviews(spark, cfg, lo, hi).select(F.sum(F.length("text"))).collect()[0][0]
    figures["JDBC partitioned read"] = n / (time.perf_counter() - t0)
    assert total_chars > 0

    run_id = str(uuid.uuid4())
    aspects = '[{"aspect":"room","sentiment":"negative"},{"aspect":"location","sentiment":"positive"}]'
    results = jdbc.read_reviews(spark, cfg, lo, hi).select(
        F.lit(run_id).alias("run_id"), "review_id", "hotel_id", F.col("created_at").alias("review_created_at"),
        "lang", F.sha2(F.col("text"), 256).alias("input_key"),
        F.element_at(F.array(*map(F.lit, ["positive", "negative", "neutral", "mixed"])),
                     (F.col("review_id") % 4 + 1).cast("int")).alias("sentiment"),
        F.lit("A short summary of the stay.").alias("summary"), F.lit(aspects).alias("aspects"),
        F.lit(False).alias("truncated"), F.lit(None).cast("string").alias("error"), F.lit("bench").alias("model"),
        F.lit("v1").alias("prompt_version"), F.lit(300).alias("tokens_in"), F.lit(60).alias("tokens_out"),
        F.lit(900).alias("latency_ms"), F.lit("2026-11-30 00:00:00").cast("timestamp").alias("analysed_at"),
    ).cache()
    results.count()

    def stage_and_upsert(label: str, rid: str) -> int:
        t0 = time.perf_counter()
        jdbc.write_stage(results.withColumn("run_id", F.lit(rid)), cfg)
        figures[f"{label}: JDBC staging write"] = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        with mysql.connect(cfg.db) as conn:
            staged = mysql.stage_summary(conn, rid)  # the reconciliation pipeline._commit does first
        figures[f"{label}: reconcile (stage_summary)"] = n / (time.perf_counter() - t0)
        assert staged.reviews == staged.rows == n, staged
        t0 = time.perf_counter()
        changed = mysql.commit_run(cfg.db, rid, chunk_rows=cfg.sink.commit_chunk_rows, dedupe=False).changed
        figures[f"{label}: upsert + aggregates commit"] = n / (time.perf_counter() - t0)
        return changed

    first = stage_and_upsert("first run", run_id)
    replay = stage_and_upsert("replay", run_id)
    spark.stop()
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "stop"], check=False, env=env)

    print(f"\nJDBC figures on {n:,} reviews (MariaDB 10.11, Connector/J {cfg.db.jdbc_jar.name}, local[2],"
          f" commit in chunks of {cfg.sink.commit_chunk_rows:,} staged rows):")
    for label, rate in figures.items():
        print(f"  {label:<45} {rate:>10,.0f} rows/s")
    print(f"  rows changed: first run {first:,}, replay of the same run {replay:,} (must be 0)")
    ratio = figures["first run: upsert + aggregates commit"] / figures["JDBC partitioned read"]
    print(f"  upsert rate / read rate: {ratio:.2f}")
    return 0 if first == n and replay == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
