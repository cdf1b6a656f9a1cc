"""job.retention_days on real MariaDB: old job_runs and stream_commits rows go at run start, in small batches;
'running' runs and the latest ledger row of every query stay."""

from __future__ import annotations

import uuid

import pytest
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import mysql
from qwenspark.pipeline import run_batch
from tests.spark.conftest import query, reset_tables

pytestmark = pytest.mark.spark


def _history(cfg: QwenSparkConfig) -> dict[str, str]:
    """job_runs and stream_commits rows of various ages; returns {name: run_id} of the job_runs rows."""
    runs = {name: str(uuid.uuid4()) for name in ("old_ok", "old_failed", "old_running", "recent_ok", "old_unfinished")}
    rows = [
        (runs["old_ok"], "succeeded", 200, 199),
        (runs["old_failed"], "failed", 120, 120),
        (runs["old_running"], "running", 300, None),  # a live driver's (or one abandon_runs has yet to mark)
        (runs["recent_ok"], "succeeded", 3, 3),
        (runs["old_unfinished"], "failed", 95, None),  # a failed run that never got its finished_at
    ]
    ledger = [("a" * 36, b, 100 + 10 - b) for b in range(10)]  # query a: 10 old batches; its latest stays
    ledger += [("b" * 36, 0, 400)]  # query b: one batch, old: it is its latest, it stays
    ledger += [("c" * 36, b, 1) for b in range(3)]  # query c: recent
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO job_runs (run_id, job, status, config_hash, model, prompt_version, started_at, finished_at)"
            " VALUES (%s, 'batch', %s, 'h', 'm', 'v1', UTC_TIMESTAMP(3) - INTERVAL %s DAY,"
            " UTC_TIMESTAMP(3) - INTERVAL %s DAY)",
            rows,
        )
        cur.executemany(
            "INSERT INTO stream_commits (query_id, batch_id, query_name, run_id, rows_in, rows_selected,"
            " rows_analysed, rows_rejected, committed_at)"
            " VALUES (%s, %s, 'q', 'r', 1, 1, 1, 0, UTC_TIMESTAMP(3) - INTERVAL %s DAY)",
            ledger,
        )
    return runs


def test_purge_deletes_old_history_in_batches_and_keeps_what_runs_need(echo_cfg: QwenSparkConfig) -> None:
    reset_tables(echo_cfg)
    runs = _history(echo_cfg)
    assert mysql.purge_history(echo_cfg.db, 0) == (0, 0), "0 keeps everything"
    # Batches of 2 rows: the loops run several times.
    assert mysql.purge_history(echo_cfg.db, 90, batch_rows=2) == (3, 9)
    kept = {r[0] for r in query(echo_cfg, "SELECT run_id FROM job_runs")}
    assert kept == {runs["old_running"], runs["recent_ok"]}
    ledger = query(echo_cfg, "SELECT query_id, batch_id FROM stream_commits ORDER BY query_id, batch_id")
    assert ledger == [("a" * 36, 9), ("b" * 36, 0), ("c" * 36, 0), ("c" * 36, 1), ("c" * 36, 2)]
    # The replay check of each query's last batch still answers.
    assert mysql.batch_committed(echo_cfg.db, "a" * 36, 9) and mysql.batch_committed(echo_cfg.db, "b" * 36, 0)
    assert mysql.purge_history(echo_cfg.db, 90) == (0, 0), "a second purge finds nothing"


def test_a_batch_run_applies_the_retention_as_it_starts(spark: SparkSession, echo_cfg: QwenSparkConfig) -> None:
    reset_tables(echo_cfg)
    runs = _history(echo_cfg)
    cfg = echo_cfg.model_copy(update={"job": echo_cfg.job.model_copy(update={"retention_days": 30})})
    summary = run_batch(spark, cfg)  # no reviews: the run itself selects nothing
    assert summary.status == "succeeded"
    kept = {r[0] for r in query(cfg, "SELECT run_id FROM job_runs")}
    assert kept == {runs["old_running"], runs["recent_ok"], summary.run_id}
    assert int(query(cfg, "SELECT COUNT(*) FROM stream_commits")[0][0]) == 5
    # retention_days=0: nothing is deleted.
    reset_tables(cfg)
    _history(cfg)
    keep = cfg.model_copy(update={"job": cfg.job.model_copy(update={"retention_days": 0})})
    run_batch(spark, keep)
    assert int(query(cfg, "SELECT COUNT(*) FROM job_runs")[0][0]) == 6
    assert int(query(cfg, "SELECT COUNT(*) FROM stream_commits")[0][0]) == 14
