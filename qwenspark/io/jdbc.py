"""Spark JDBC reads and writes (MariaDB Connector/J): partitioned review reads and the staging append."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
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


def sql_datetime(value: datetime) -> str:
    """A DATETIME literal of value in UTC: aware values are converted, naive ones are UTC already."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return f"'{value.strftime('%Y-%m-%d %H:%M:%S.%f')}'"


def source_predicate(cfg: QwenSparkConfig) -> str:
    """The configured selection as ONE SQL predicate, used by both id_bounds and the Spark JDBC read.

    Its values are literals built here from typed config values (ints, and UTC DATETIME literals), never text
    from outside, so the same predicate can go where JDBC takes no parameters (the read's subquery). DATETIME
    has no time zone: comparing it with a UTC literal is exact whatever the zone of the driver, the executors
    or the server session. (Spark's own filter on a naive Python datetime went through the driver's local
    zone, so a UTC+8 driver skipped eight hours of reviews a night.)
    """
    src = cfg.source
    clauses = ["1 = 1"]
    if src.min_id is not None:
        clauses.append(f"review_id >= {int(src.min_id)}")
    if src.max_id is not None:
        clauses.append(f"review_id <= {int(src.max_id)}")
    column = src.window_column  # one of two names (a Literal in the config): safe to write into the SQL
    if src.created_from is not None:
        clauses.append(f"{column} >= {sql_datetime(src.created_from)}")
    if src.created_until is not None:
        clauses.append(f"{column} < {sql_datetime(src.created_until)}")
    return " AND ".join(clauses)


def id_bounds(cfg: QwenSparkConfig) -> tuple[int, int, int]:
    """(min id, max id, rows) of the selected reviews, read once so the run's range is fixed at its start.

    Also checks that the source table has the columns the job reads and the window column (a clear error before
    Spark reads it).
    """
    table = cfg.source.table
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table} LIMIT 0")
        cur.fetchall()
        have = {d[0].lower() for d in cur.description or ()}
        missing = [c for c in INPUT_SCHEMA.fieldNames() if c not in have]
        if missing:
            raise SourceError(f"source.table {table} lacks columns {missing}")
        if cfg.source.window_column not in have:
            raise SourceError(
                f"source.table {table} has no column {cfg.source.window_column} (source.window_column): hotel_reviews "
                "gets it from `qwenspark init-db` (schema v004); a table of your own needs `updated_at DATETIME(3) "
                "NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)` and an index on it")
        cur.execute(f"SELECT MIN(review_id), MAX(review_id), COUNT(*) FROM {table} WHERE {source_predicate(cfg)}")
        lo, hi, n = cur.fetchone()
    return (int(lo), int(hi), int(n)) if n else (0, -1, 0)


def _partitioned(spark: SparkSession, cfg: QwenSparkConfig, table: str, lo: int, hi: int) -> DataFrame:
    # upperBound is hi, not hi + 1: Spark's last partition is open-ended (review_id >= its start), so hi is read
    # either way, and hi + 1 overflows a BIGINT for review_id 9223372036854775807.
    return (
        spark.read.format("jdbc")
        .options(**jdbc_options(cfg))
        .option("dbtable", table)
        .option("partitionColumn", "review_id")
        .option("lowerBound", str(lo))
        .option("upperBound", str(hi))
        .option("numPartitions", str(cfg.source.num_partitions))
        .option("fetchsize", str(cfg.source.fetchsize))
        .load()
    )


def read_reviews(spark: SparkSession, cfg: QwenSparkConfig, lo: int, hi: int) -> DataFrame:
    """Reviews with lo <= review_id <= hi and source_predicate (the same as id_bounds), in INPUT_SCHEMA's columns.

    The predicate runs in MariaDB, in a subquery the partitioned read wraps. Columns other than review_id are
    converted with try_cast: a value of another type that does not convert (Spark 4's ANSI casts raise) becomes
    NULL instead of failing the run.
    """
    # created_at crosses JDBC as its text, parsed by Spark: zero and partial-zero dates ('2026-00-15') become NULL
    # instead of a neighbouring day (the JDBC driver rolls them over), and 1582-10-05..14 stay as stored (Spark's
    # calendar is proleptic Gregorian; java.sql.Timestamp's is Julian before 1582). DATETIME text is zone-free.
    cols = ", ".join(
        "CAST(created_at AS CHAR) AS created_at" if c == "created_at" else c for c in INPUT_SCHEMA.fieldNames()
    )
    query = (
        f"(SELECT {cols} FROM {cfg.source.table}"
        f" WHERE review_id BETWEEN {int(lo)} AND {int(hi)} AND {source_predicate(cfg)}) AS qwenspark_source"
    )
    df = _partitioned(spark, cfg, query, lo, hi)
    return df.select(
        *(
            (F.col(f.name).cast(f.dataType) if f.name == "review_id" else F.col(f.name).try_cast(f.dataType)).alias(
                f.name
            )
            for f in INPUT_SCHEMA.fields
        )
    )


def read_done(spark: SparkSession, cfg: QwenSparkConfig, lo: int, hi: int) -> DataFrame:
    """(review_id, input_key, error, hotel_id, review_created_at) of results already stored for the id range.

    review_created_at crosses as text and is parsed as read_reviews parses created_at: a DATETIME stored as it was
    read compares equal to the source's, whatever its value (zero dates: NULL on both sides).
    """
    query = (
        "(SELECT review_id, input_key, error, hotel_id, CAST(review_created_at AS CHAR) AS review_created_at"
        f" FROM review_sentiment WHERE review_id BETWEEN {int(lo)} AND {int(hi)}) AS qwenspark_done"
    )
    df = _partitioned(spark, cfg, query, lo, hi)
    created = INPUT_SCHEMA["created_at"].dataType
    return df.select("review_id", "input_key", "error", "hotel_id",
                     F.col("review_created_at").try_cast(created).alias("review_created_at"))


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
