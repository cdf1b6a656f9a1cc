"""Fixtures for the dashboard: the test MariaDB holding known results (written as the schema owner, aggregates
recomputed by sql/recompute_aggregates.sql) and the app as the read-only dashboard account."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.io import mysql
from tests.spark.conftest import ROOT, reset_tables, server_sets

BIGINT_MAX = 2**63 - 1
HOSTILE_SUMMARY = "<b>bold</b><script>window.__pwned = 2</script> 前台<img src=x onerror=window.__pwned=3>"
# (review_id, hotel_id, created_at, lang, sentiment, summary, aspects, error, text)
KNOWN: list[tuple[Any, ...]] = [
    (1, "H01", "2026-03-01 09:00:00", "en", "positive", "Great stay", [("room", "positive"), ("service", "positive")],
     None, "Great room, friendly staff."),
    (2, "H01", "2026-03-01 18:30:00", "zh", "negative", "房间很脏", [("cleanliness", "negative")], None,
     "房间很脏，不会再来。"),
    (3, "H01", "2026-03-02 11:00:00", "en", "mixed", "Good location, noisy", [("location", "positive"),
     ("noise", "negative")], None, "Good location but noisy at night."),
    (BIGINT_MAX, "H02", "2026-03-01 12:00:00", "en", "negative", HOSTILE_SUMMARY, [("service", "negative")], None,
     "<script>window.__pwned = 1</script> awful service"),
    (5, "H02", "2026-03-03 08:00:00", "zh", "positive", "早餐很好", [("food", "positive")], None,
     "早餐很好，服务周到。"),
    (6, "H03", "2026-03-03 20:00:00", None, None, None, [], "parse: no JSON object", "???"),
]


def dashboard_cfg(mariadb: dict[str, object], *extra: str) -> QwenSparkConfig:
    """conf/local.yaml pointed at the test server, the dashboard logging in as its read-only account."""
    return load_config(ROOT / "conf" / "local.yaml", [
        *server_sets(mariadb),
        f"db.dashboard_password_file={mariadb['dashboard_password_file']}",
        "db.dashboard_password_env=QWENSPARK_TEST_NO_SUCH_VAR",
        *extra,
    ])


def insert_results(cfg: QwenSparkConfig, rows: Iterable[tuple[Any, ...]], run_id: str | None = None) -> None:
    """Write reviews and their results as the schema owner, then recompute every aggregate from review_sentiment."""
    run_id = run_id or str(uuid.uuid4())
    now = dt.datetime(2026, 3, 4, 1, 0, 0)
    with mysql.connect(cfg.db.owner()) as conn, conn.cursor() as cur:
        for rid, hotel, created, lang, sentiment, summary, aspects, error, text in rows:
            cur.execute("INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text) "
                        "VALUES (%s, %s, %s, %s, NULL, %s)", (rid, hotel, created, lang, text))
            cur.execute(
                "INSERT INTO review_sentiment (review_id, hotel_id, review_created_at, lang, input_key, sentiment, "
                "summary, aspects, truncated, error, model, prompt_version, tokens_in, tokens_out, latency_ms, "
                "analysed_at, run_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 0, %s, 'test-model', 'v1', 10, 20, 5, "
                "%s, %s)",
                (rid, hotel, created, lang, "k" * 64, sentiment, summary,
                 json.dumps([{"aspect": a, "sentiment": s} for a, s in aspects], ensure_ascii=False), error, now,
                 run_id))
        mysql.run_script(conn, mysql.sql_text("recompute_aggregates.sql"))
        conn.commit()


def insert_runs(cfg: QwenSparkConfig) -> None:
    """Two runs in job_runs: a failed one, then a succeeded one."""
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        for i, (status, analysed, errors, message) in enumerate(
                [("failed", 0, 0, "engine: connection refused <script>x</script>"), ("succeeded", 6, 1, None)]):
            cur.execute(
                "INSERT INTO job_runs (run_id, job, status, config_hash, model, prompt_version, started_at, "
                "finished_at, rows_selected, rows_analysed, rows_ok, rows_error, rows_changed, seconds_total, message) "
                "VALUES (%s, 'batch', %s, 'h', 'test-model', 'v1', %s, %s, %s, %s, %s, %s, %s, 3.0, %s)",
                (str(uuid.uuid4()), status, dt.datetime(2026, 3, 4, 1, i), dt.datetime(2026, 3, 4, 1, i, 30),
                 analysed, analysed, analysed - errors, errors, analysed, message))


@pytest.fixture
def known(mariadb: dict[str, object]) -> QwenSparkConfig:
    """The test server emptied, then holding KNOWN and two runs; the config the dashboard uses."""
    cfg = dashboard_cfg(mariadb)
    reset_tables(cfg)
    insert_results(cfg, KNOWN)
    insert_runs(cfg)
    return cfg


@pytest.fixture
def empty(mariadb: dict[str, object]) -> QwenSparkConfig:
    """The test server with no results at all."""
    cfg = dashboard_cfg(mariadb)
    reset_tables(cfg)
    return cfg


def artifacts() -> Path:
    """Where the browser tests leave their screenshots (.run/artifacts/dashboard)."""
    folder = ROOT / ".run" / "artifacts" / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
