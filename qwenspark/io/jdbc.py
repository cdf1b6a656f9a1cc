"""Spark JDBC reads and writes (MariaDB Connector/J): partitioned review reads and the staging append."""

from __future__ import annotations

import logging

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from qwenspark.config import QwenSparkConfig
from qwenspark.errors import SourceError
from qwenspark.io import mysql
from qwenspark.schemas import INPUT_SCHEMA

log = logging.getLogger(__name__)


def jdbc_options(cfg: QwenSparkConfig) -> dict[str, str]:
    db = cfg.db
    # Spark redacts option values matching spark.redaction.regex (password) from logs and the UI.
    return {
        "url": db.jdbc_url(),
        "driver": db.jdbc_driver,
        "user": db.user,
        "password": db.password().get_secret_value(),
    }


def _source_filter(cfg: QwenSparkConfig) -> tuple[str, dict[str, object]]:
    src = cfg.source
    clauses, params = ["1 = 1"], {}
    for key, clause in (
        ("min_id", "review_id >= %(min_id)s"),
        ("max_id", "review_id <= %(max_id)s"),
        ("created_from", "created_at >= %(created_from)s"),
        ("created_until", "created_at < %(created_until)s"),
    ):
        value = getattr(src, key)
        if value is not None:
            clauses.append(clause)
            params[key] = value
    return " AND ".join(clauses), params


def id_bounds(cfg: QwenSparkConfig) -> tuple[int, int, int]:
    """(min id, max id, rows) of the selected reviews, read once so the run's range is fixed at its start."""
    where, params = _source_filter(cfg)
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT MIN(review_id), MAX(review_id), COUNT(*) FROM {cfg.source.table} WHERE {where}", params)
        lo, hi, n = cur.fetchone()
    return (int(lo), int(hi), int(n)) if n else (0, -1, 0)


def _partitioned(spark: SparkSession, cfg: QwenSparkConfig, table: str, lo: int, hi: int) -> DataFrame:
    return (
        spark.read.format("jdbc")
        .options(**jdbc_options(cfg))
        .option("dbtable", table)
        .option("partitionColumn", "review_id")
        .option("lowerBound", str(lo))
        .option("upperBound", str(hi + 1))
        .option("numPartitions", str(cfg.source.num_partitions))
        .option("fetchsize", str(cfg.source.fetchsize))
        .load()
    )


def read_reviews(spark: SparkSession, cfg: QwenSparkConfig, lo: int, hi: int) -> DataFrame:
    """Reviews with lo <= review_id <= hi (and the configured time window), in INPUT_SCHEMA's columns."""
    df = _partitioned(spark, cfg, cfg.source.table, lo, hi)
    missing = [c for c in INPUT_SCHEMA.fieldNames() if c not in df.columns]
    if missing:
        raise SourceError(f"read: table {cfg.source.table} lacks columns {missing}")
    cond: Column = (F.col("review_id") >= lo) & (F.col("review_id") <= hi)
    if cfg.source.created_from:
        cond &= F.col("created_at") >= F.lit(cfg.source.created_from)
    if cfg.source.created_until:
        cond &= F.col("created_at") < F.lit(cfg.source.created_until)
    return df.where(cond).select(*(F.col(f.name).cast(f.dataType).alias(f.name) for f in INPUT_SCHEMA.fields))


def read_done(spark: SparkSession, cfg: QwenSparkConfig, lo: int, hi: int) -> DataFrame:
    """(review_id, input_key, error) of results already stored for the id range."""
    df = _partitioned(spark, cfg, "review_sentiment", lo, hi)
    return df.where((F.col("review_id") >= lo) & (F.col("review_id") <= hi)).select("review_id", "input_key", "error")


def write_stage(df: DataFrame, cfg: QwenSparkConfig) -> None:
    """Append a run's rows to review_sentiment_stage over sink.write_partitions JDBC connections.

    A shuffle (repartition), not coalesce: coalesce is narrow and would pull the stage that produces df (the
    model) down to write_partitions tasks. With the shuffle the producing stage keeps its own parallelism and
    its output is materialised once in shuffle files; a retried write task reads them again. A write task that
    is retried after part of its rows were committed (isolation NONE, or a lost acknowledgement) stages them
    twice: the commit keeps one row per review (review_sentiment_stage has no unique key on purpose).
    """
    (
        df.repartition(cfg.sink.write_partitions)
        .write.format("jdbc")
        .options(**jdbc_options(cfg))
        .option("dbtable", "review_sentiment_stage")
        .option("batchsize", str(cfg.sink.batchsize))
        .option("isolationLevel", cfg.sink.isolation_level)
        .mode("append")
        .save()
    )
