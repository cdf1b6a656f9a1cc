"""Streaming sources: new hotel_reviews rows by review_id (a PySpark Python data source) and a landing folder."""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StringType, StructField, StructType

from qwenspark.config import DbConfig, QwenSparkConfig
from qwenspark.io import mysql
from qwenspark.schemas import INPUT_SCHEMA

log = logging.getLogger(__name__)

SOURCE_NAME = "qwenspark_reviews"
CORRUPT = "_corrupt_record"
# An offset is {"after_id": N}: every review with review_id <= N has been handed to a micro-batch.
_KEY = "after_id"
# Under ReadAllAvailable (a trigger that ignores the row limit) one batch still reads at most this many ids.
_SCAN_CAP = 1_000_000


class IdRange(InputPartition):
    """Reviews with lo < review_id <= hi: one read task."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


def split_range(lo: int, hi: int, parts: int) -> list[IdRange]:
    """(lo, hi] cut into at most `parts` contiguous, non-overlapping ranges covering it exactly."""
    if hi <= lo:
        return []
    width = hi - lo
    parts = max(1, min(parts, width))
    bounds = [lo + width * i // parts for i in range(parts + 1)]
    return [IdRange(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def settled_end(after: int, ids: Sequence[int], gaps: dict[int, float], now: float, wait: float) -> int:
    """The last id of `ids` (ascending, all > after) that no young gap precedes.

    A missing id below a visible one may belong to a transaction that has not committed yet (auto-increment
    ids are handed out before commit). The offset stops before such a gap until it is `wait` seconds old;
    an older gap is taken as a rollback or a deleted row and passed. `gaps` (first id after a gap -> when it
    was first seen) is kept by the caller between calls.
    """
    end = after
    for rid in ids:
        if rid != end + 1 and wait > 0:
            first_seen = gaps.setdefault(rid, now)
            if now - first_seen < wait:
                break
        end = rid
    for rid in [r for r in gaps if r <= end]:
        del gaps[rid]
    return end


class ReviewStreamReader(DataSourceStreamReader):
    """Offsets are review_id watermarks; each micro-batch takes at most max_rows new reviews, in id order."""

    def __init__(self, options: dict[str, str]) -> None:
        # read_stream sets every option from the typed config: no second set of defaults here.
        self.db = DbConfig.model_validate_json(options["db"])
        self.password = SecretStr(options["password"])
        self.table = options["table"]
        self.max_rows = int(options["max_rows_per_batch"])
        self.parts = int(options["read_partitions"])
        self.start_after = options["start_after_id"]
        self.gap_wait = float(options["gap_wait_seconds"])
        self.gaps: dict[int, float] = {}

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with mysql.connect(self.db, autocommit=True, password=self.password) as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall())

    def initialOffset(self) -> dict[str, int]:
        """Where a new checkpoint starts: before the first review, after a given id, or after the newest."""
        if self.start_after == "latest":
            ((newest,),) = self._query(f"SELECT COALESCE(MAX(review_id), -1) FROM {self.table}")
            return {_KEY: int(newest)}
        if self.start_after:
            return {_KEY: int(self.start_after)}
        # One below the first id, in Python: in SQL, MIN(review_id) - 1 is out of BIGINT's range when a review has
        # id -9223372036854775808. (The offset is JSON and the comparisons are exact beyond BIGINT.)
        ((oldest,),) = self._query(f"SELECT COALESCE(MIN(review_id), 0) FROM {self.table}")
        return {_KEY: int(oldest) - 1}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        """The next watermark: at most limit rows past start, stopping before a gap younger than gap_wait."""
        after = int(start[_KEY])
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else _SCAN_CAP
        if not isinstance(limit, ReadMaxRows | ReadAllAvailable):
            log.warning("unknown read limit %r: reading up to %d rows", limit, cap)
        rows = self._query(
            f"SELECT review_id FROM {self.table} WHERE review_id > %s ORDER BY review_id LIMIT %s", (after, cap)
        )
        end = settled_end(after, [int(r[0]) for r in rows], self.gaps, time.monotonic(), self.gap_wait)
        return {_KEY: end}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return split_range(int(start[_KEY]), int(end[_KEY]), self.parts)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The partition's reviews in INPUT_SCHEMA's types (see as_input_row)."""
        assert isinstance(partition, IdRange)
        cols = ", ".join(INPUT_SCHEMA.fieldNames())
        rows = self._query(
            f"SELECT {cols} FROM {self.table} WHERE review_id > %s AND review_id <= %s ORDER BY review_id",
            (partition.lo, partition.hi),
        )
        for row in rows:
            yield as_input_row(row)

    def commit(self, end: dict[str, int]) -> None:
        pass


class ReviewStreamSource(DataSource):
    """`spark.readStream.format("qwenspark_reviews")`: new rows of a hotel_reviews table, by review_id."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return INPUT_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ReviewStreamReader(dict(self.options))


def as_input_row(row: Sequence[Any]) -> tuple[Any, ...]:
    """A source row as INPUT_SCHEMA's types, whatever the user's column types hold: a value that does not fit
    becomes NULL (the row then gets its per-row result) instead of failing the read task and the stream.

    DATETIMEs are marked UTC (the session time zone of the jobs); a zero date (the driver hands it over as text
    or None) is NULL. Text columns may be numbers or bytes in a user's table.
    """
    review_id, hotel_id, created, lang, rating, text = row
    created_utc = created.replace(tzinfo=UTC) if isinstance(created, datetime) else None
    return int(review_id), _text(hotel_id), created_utc, _text(lang), _int32(rating), _text(text)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _int32(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if -(2**31) <= number < 2**31 else None


def read_stream(spark: SparkSession, cfg: QwenSparkConfig) -> DataFrame:
    """The configured streaming source as a DataFrame in INPUT_SCHEMA's columns (review_id may be NULL: files)."""
    st = cfg.stream
    if st.source == "mysql":
        spark.dataSource.register(ReviewStreamSource)
        db_json = cfg.db.model_dump_json()
        start = "" if st.start_after_id is None else str(st.start_after_id)
        return (
            spark.readStream.format(SOURCE_NAME)
            .option("db", db_json)
            # As for Spark's JDBC source: the option travels to the tasks; Spark redacts it in plans and the UI.
            .option("password", cfg.db.password().get_secret_value())
            .option("table", cfg.source.table)
            .option("max_rows_per_batch", str(st.max_rows_per_batch))
            .option("read_partitions", str(st.read_partitions))
            .option("start_after_id", start)
            .option("gap_wait_seconds", str(st.gap_wait_seconds))
            .load()
        )
    schema = INPUT_SCHEMA
    if st.files_format != "parquet":
        # A line that does not parse keeps its raw text here and becomes a reject, not a row of NULLs.
        schema = StructType([*INPUT_SCHEMA.fields, StructField(CORRUPT, StringType(), True)])
    reader = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", st.max_files_per_trigger)
        .option("columnNameOfCorruptRecord", CORRUPT)
    )
    if st.files_format == "csv":
        # Reviews hold newlines and commas: quoted multi-line CSV with a header, as pandas/Excel write it.
        # Spark maps CSV columns by position; enforceSchema=false turns a header in another order into an
        # error instead of reviews silently landing in the wrong columns.
        reader = (
            reader.option("header", "true").option("multiLine", "true").option("escape", '"')
            .option("enforceSchema", "false")
        )
    return reader.format(st.files_format).load(st.files_path)


def reject_json(row: dict[str, Any]) -> str:
    """A rejected row as JSON text (timestamps as ISO strings), storable whatever its strings hold."""
    text = json.dumps(row, default=str, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate cannot go to utf8mb4: escaped (\ud800), as JSON allows
        return json.dumps(row, default=str, ensure_ascii=True)
    return text
