"""A stream runs for weeks: the accumulators each micro-batch's run creates must not pile up on the driver
(pyspark keeps every accumulator in pyspark.accumulators._accumulatorRegistry for the SparkContext's life)."""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd
import pytest
from pyspark.accumulators import _accumulatorRegistry
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import mysql
from qwenspark.pipeline import new_metrics, run_batch
from qwenspark.stream import run_stream
from tests.spark.conftest import query, reset_tables

pytestmark = pytest.mark.spark


def test_a_real_stream_leaves_the_accumulator_registry_as_it_found_it(
    spark: SparkSession, echo_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    """12 micro-batches, each a full tracked run through the model stage: the registry does not grow (before the
    fix it grew by 5 per micro-batch)."""
    stream = {"checkpoint_location": str(tmp_path / "checkpoint"), "trigger_seconds": 0.5, "max_rows_per_batch": 2,
              "gap_wait_seconds": 0.0, "available_now": True, "keepalive_seconds": 0.0}
    cfg = echo_cfg.model_copy(update={"stream": echo_cfg.stream.model_copy(update=stream),
                                      "job": echo_cfg.job.model_copy(update={"repartition": 1})})
    reset_tables(cfg)
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
                        " VALUES (%s, 'H1', '2026-11-29 12:00:00', 'en', NULL, %s)",
                        [(rid, dev_reviews.text.iloc[rid]) for rid in range(1, 25)])
    before = set(_accumulatorRegistry)
    report = run_stream(spark, cfg, threading.Event())
    assert report.batches_committed == 12 and report.rows_analysed == 24
    # The accumulators were read before release: every micro-batch's run recorded its engine batches through them
    # (engine loads would not do: a reused Python worker keeps the engine an earlier test loaded).
    batches = query(cfg, "SELECT COUNT(*), MIN(engine_batches) FROM job_runs WHERE rows_analysed > 0")[0]
    assert batches[0] == 12 and int(batches[1]) >= 1, batches
    assert int(query(cfg, "SELECT COUNT(*) FROM review_sentiment")[0][0]) == 24
    assert set(_accumulatorRegistry) == before, "no accumulator of any micro-batch stays registered"


def test_a_failed_run_releases_its_accumulators(spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path) -> None:
    engine = echo_cfg.engine.model_copy(update={"factory": "tests.support.echo_engine:no_such_factory"})
    cfg = echo_cfg.model_copy(update={"engine": engine})
    reset_tables(cfg)
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
                    " VALUES (1, 'H1', '2026-11-29 12:00:00', 'en', NULL, 'Nice room.')")
    before = set(_accumulatorRegistry)
    with pytest.raises(Exception, match="no_such_factory"):
        run_batch(spark, cfg)
    assert query(cfg, "SELECT status FROM job_runs") == [("failed",)]
    assert set(_accumulatorRegistry) == before


def test_a_thousand_runs_worth_of_metrics_keep_the_registry_constant(spark: SparkSession) -> None:
    """The per-run lifecycle (pipeline.new_metrics, tasks adding, values read, Metrics.release) 1,000 times: a real
    1,000-batch stream is minutes of Spark jobs on this machine. Every 50th set takes real task updates, so the
    update server is shown to keep working for the sets created after many releases."""
    sc = spark.sparkContext
    size = len(_accumulatorRegistry)
    for i in range(1000):
        metrics = new_metrics(spark)
        if i % 50 == 0:
            rows = metrics.rows
            sc.parallelize(range(10), 2).foreach(lambda x, acc=rows: acc.add(1))
            assert metrics.rows.value == 10
        metrics.release()
        assert len(_accumulatorRegistry) == size, f"set {i} left accumulators behind"
