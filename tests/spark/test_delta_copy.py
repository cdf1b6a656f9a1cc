"""The batch job with the Delta copy on: each committed review once in Delta, a second run changes nothing
(the echo engine: the copy, not the model, is tested here)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import delta
from qwenspark.io.delta import backfill_delta, read_delta_as_spark, run_version
from qwenspark.pipeline import run_batch
from tests.spark.conftest import load_reviews, query, reset_tables

pytestmark = pytest.mark.spark

deltalake = pytest.importorskip("deltalake")


def _reviews(dev: pd.DataFrame, n: int = 12) -> pd.DataFrame:
    """n real dev reviews on 3 days plus a blank one (an error row)."""
    real = dev.head(n)
    k = n + 1
    return pd.DataFrame(
        {
            "review_id": range(1, k + 1),
            "hotel_id": [f"H{i % 2}" for i in range(k)],
            "created_at": [f"2026-11-{1 + i % 3:02d} 10:00:00" for i in range(k)],
            "lang": [*real.lang, "zh"],
            "rating": [""] * k,
            "text": [*real.text, "   "],
        }
    )


def test_delta_copy_each_review_once_then_unchanged(
    spark: SparkSession,
    echo_cfg: QwenSparkConfig,
    dev_reviews: pd.DataFrame,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reset_tables(echo_cfg)
    reviews = _reviews(dev_reviews)
    load_reviews(echo_cfg, reviews, tmp_path)
    path = str(tmp_path / "delta" / "review_sentiment")
    cfg = echo_cfg.model_copy(
        update={"delta": echo_cfg.delta.model_copy(update={"enabled": True, "path": path})}
    )
    n = len(reviews)

    first = run_batch(spark, cfg)
    assert (first.status, first.rows_analysed) == ("succeeded", n)
    df = read_delta_as_spark(spark, path)
    got = sorted((r.review_id, r.run_id, str(r.day)) for r in df.select("review_id", "run_id", "day").collect())
    assert [g[0] for g in got] == list(range(1, n + 1)), "each review once"
    assert {g[1] for g in got} == {first.run_id}
    # hotel_reviews.created_at is NOT NULL, so every day here is the review's (the NULL case: tests/unit)
    assert {g[2] for g in got} == {"2026-11-01", "2026-11-02", "2026-11-03"}
    # the copy is what MySQL committed, column for column
    mysql_rows = query(cfg, "SELECT review_id, sentiment, error, summary FROM review_sentiment ORDER BY review_id")
    cols = ("review_id", "sentiment", "error", "summary")
    delta_rows = [tuple(r) for r in df.select(*cols).orderBy("review_id").collect()]
    assert delta_rows == mysql_rows
    assert sum(r[2] is not None for r in mysql_rows) == 1 and sum(r[1] is not None for r in mysql_rows) == n - 1
    (commit_seq,) = query(cfg, f"SELECT commit_seq FROM job_runs WHERE run_id = '{first.run_id}'")[0]
    table = deltalake.DeltaTable(path)
    assert table.transaction_version(cfg.delta.app_id) == run_version(cfg, first.run_id) == first.commit_seq
    assert commit_seq == first.commit_seq
    before = table.version()

    second = run_batch(spark, cfg)
    assert (second.status, second.rows_analysed, second.rows_skipped) == ("succeeded", 0, n)
    assert deltalake.DeltaTable(path).version() == before, "no commit when nothing was analysed"
    assert read_delta_as_spark(spark, path).count() == n
    assert query(cfg, "SELECT COUNT(*) FROM job_runs WHERE message IS NOT NULL")[0][0] == 0

    # A Delta failure after the MySQL commit does not fail the run: it is logged and noted in job_runs,
    # and backfill_delta (or the next run that analyses rows) appends the missing run.
    def broken(*args: object, **kwargs: object) -> bool:
        raise OSError("disk full")

    monkeypatch.setattr(delta, "write_delta", broken)
    third = run_batch(spark, cfg.model_copy(update={"job": cfg.job.model_copy(update={"reprocess": True})}))
    assert (third.status, third.rows_analysed) == ("succeeded", n)
    assert query(cfg, f"SELECT status, message FROM job_runs WHERE run_id = '{third.run_id}'") == [
        ("succeeded", "delta copy failed: OSError: disk full")]
    assert deltalake.DeltaTable(path).version() == before
    monkeypatch.undo()
    assert backfill_delta(cfg) == 1
    assert backfill_delta(cfg) == 0, "a second backfill finds nothing to do"
    runs = read_delta_as_spark(spark, path).groupBy("run_id").count().collect()
    assert {r.run_id: r["count"] for r in runs} == {first.run_id: n, third.run_id: n}
