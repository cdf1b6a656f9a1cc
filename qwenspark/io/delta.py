"""Delta Lake copy of the results: each committed run appended once, under a Delta app transaction."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from qwenspark.config import DeltaConfig, QwenSparkConfig
from qwenspark.errors import ConfigError
from qwenspark.io import mysql
from qwenspark.schemas import RESULT_SCHEMA

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# run_id (added by the pipeline) and the partition column come after RESULT_SCHEMA's columns.
DELTA_COLUMNS: tuple[str, ...] = (*RESULT_SCHEMA.fieldNames(), "run_id", "day")


def _arrow_type(spark_type: str) -> pa.DataType:
    # Timestamps are UTC instants (the MySQL session runs at +00:00): Delta `timestamp`, not `timestamp_ntz`,
    # so older Delta readers and delta-spark read the table without the timestampNtz table feature.
    return {
        "bigint": pa.int64(),
        "int": pa.int32(),
        "string": pa.string(),
        "boolean": pa.bool_(),
        "timestamp": pa.timestamp("us", tz="UTC"),
    }[spark_type]


def delta_schema() -> pa.Schema:
    """The Arrow schema of the Delta table: RESULT_SCHEMA, run_id, and the `day` partition."""
    fields = [pa.field(f.name, _arrow_type(f.dataType.simpleString()), f.nullable) for f in RESULT_SCHEMA.fields]
    return pa.schema([*fields, pa.field("run_id", pa.string(), False), pa.field("day", pa.date32(), False)])


def to_delta_rows(results: pd.DataFrame | pa.Table) -> pa.Table:
    """Result rows (pandas or Arrow, with run_id) in the table's schema, `day` derived from the timestamps."""
    table = results if isinstance(results, pa.Table) else pa.Table.from_pandas(results, preserve_index=False)
    schema = delta_schema()
    missing = [n for n in schema.names if n != "day" and n not in table.column_names]
    if missing:
        raise ValueError(f"delta: result rows lack columns {missing}")
    columns: list[pa.ChunkedArray] = []
    for field in schema:
        if field.name == "day":
            continue
        col = table[field.name]
        if pa.types.is_timestamp(field.type) and pa.types.is_timestamp(col.type) and col.type.tz is None:
            # Naive values are UTC wall clock (MySQL at +00:00, Spark tests at UTC): relabel, do not shift.
            col = col.cast(pa.timestamp("us")).cast(field.type)
        columns.append(col.cast(field.type))
    names = [f.name for f in schema if f.name != "day"]
    created, analysed = columns[names.index("review_created_at")], columns[names.index("analysed_at")]
    # A review without created_at still needs a partition: the day it was analysed (never NULL).
    day = pc.coalesce(created, analysed).cast(pa.date32())
    return pa.Table.from_arrays([*columns, day], schema=schema)


def write_delta(results: pd.DataFrame | pa.Table, cfg: DeltaConfig, *, app_id: str, version: int) -> bool:
    """Append one run's rows under (app_id, version); False when the table already holds that version or later.

    Two writers, picked by `delta.writer`:

    - `deltalake` (default): delta-rs from the driver (`pip install 'qwenspark[delta]'`). No JVM jars needed.
      Before writing, the table's app-transaction version for `delta.app_id` is read; a run whose version is
      not above it is a replay and is skipped (write_delta returns False).
    - `spark`: when delta-spark's jars are on the classpath (e.g. `spark.jars.packages
      io.delta:delta-spark_2.13:<version>` reachable from the cluster, plus `spark.sql.extensions
      io.delta.sql.DeltaSparkSessionExtension` and `spark.sql.catalog.spark_catalog
      org.apache.spark.sql.delta.catalog.DeltaCatalog`), set `--set delta.writer=spark`: the rows are written with
      `df.write.format("delta").option("txnAppId", app_id).option("txnVersion", version).partitionBy("day")
      .mode("append").save(path)`, and delta-spark itself skips a (txnAppId, txnVersion) it has seen. That branch is
      UNTESTED here: Maven is unreachable and no PyPI/Debian package ships the Delta jars; the `delta-spark` wheel
      also pins pyspark<=4.2 while qwenspark pins 4.3. Both writers produce the same table (same columns,
      `day` partitions, same app id and versions), so one can switch between them on an existing table.

    Reading back without Delta jars: `read_delta_as_spark(spark, path)`; reading the folder as plain parquet would
    also return files that Delta has logically removed.
    """
    rows = to_delta_rows(results)
    if cfg.writer == "spark":
        return _write_spark(rows, cfg, app_id=app_id, version=version)
    from deltalake import CommitProperties, Transaction, write_deltalake

    current = table_version(cfg.path, app_id)
    if current is not None and version <= current:
        log.info("delta %s: %s version %d already written (table at %d): skipped", cfg.path, app_id, version, current)
        return False
    # The app transaction is committed atomically with the data: a crash between the two cannot happen, so
    # "version recorded" means "rows present" and the check above is exact.
    write_deltalake(
        cfg.path,
        rows,
        partition_by=["day"],
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id, version)]),
    )
    log.info("delta %s: appended %d rows as %s version %d", cfg.path, rows.num_rows, app_id, version)
    return True


def _write_spark(rows: pa.Table, cfg: DeltaConfig, *, app_id: str, version: int) -> bool:
    # UNTESTED (no Delta jars reachable here). delta-spark skips a txnVersion it has already recorded for
    # txnAppId by itself, silently, so this returns True for "handed to delta-spark", not "rows appended".
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        raise ConfigError("delta.writer=spark needs an active SparkSession with the delta-spark jars")
    df: DataFrame = spark.createDataFrame(rows)
    (
        df.write.format("delta")
        .option("txnAppId", app_id)
        .option("txnVersion", str(version))
        .partitionBy("day")
        .mode("append")
        .save(cfg.path)
    )
    return True


def table_version(path: str, app_id: str) -> int | None:
    """The app transaction version recorded for app_id (None: no table yet, or never written by app_id)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path).transaction_version(app_id)
    except TableNotFoundError:
        return None


def read_delta_as_spark(spark: SparkSession, path: str) -> DataFrame:
    """The table's current snapshot in Spark without Delta jars (only the files the Delta log says are live)."""
    from deltalake import DeltaTable

    files: Sequence[str] = DeltaTable(path).file_uris()
    if not files:
        raise ValueError(f"delta table {path} holds no data files")
    # basePath keeps `day` as a column: Spark discovers it from the day=YYYY-MM-DD folders of the files.
    return spark.read.option("basePath", path).parquet(*files)


def run_version(cfg: QwenSparkConfig, run_id: str) -> int | None:
    """A committed run's app-transaction version: its job_runs.commit_seq (None: the run has not committed).

    commit_seq comes from a sequence taken inside the run's last MySQL commit transaction, whose row stays locked
    until that COMMIT (mysql.next_seq): versions grow in commit order whichever driver, clock or app_id committed,
    and a version is visible only once every lower one is committed (or rolled back, leaving a gap). Runs
    committed before schema v003 keep the version they had (their finished_at in epoch ms), and the sequence
    started above those (migration v003).
    """
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT commit_seq FROM job_runs WHERE run_id = %s AND status = 'succeeded'", (run_id,))
        row = cur.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def run_rows(cfg: QwenSparkConfig, run_id: str) -> pa.Table:
    """The rows run_id holds in review_sentiment: the committed truth, not what Spark computed."""
    cols = [*RESULT_SCHEMA.fieldNames(), "run_id"]
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(cols)} FROM review_sentiment WHERE run_id = %s ORDER BY review_id", (run_id,))
        fetched: list[tuple[Any, ...]] = list(cur.fetchall())
    data = {c: [r[i] for r in fetched] for i, c in enumerate(cols)}
    # TINYINT(1) comes back as an int; JSON (MySQL 8) may come back as bytes. to_delta_rows does the rest.
    data["truncated"] = [bool(v) for v in data["truncated"]]
    data["aspects"] = [v.decode() if isinstance(v, bytes | bytearray) else v for v in data["aspects"]]
    return pa.Table.from_pydict(data)


def _committed_runs(cfg: QwenSparkConfig, after: int | None) -> list[tuple[str, int]]:
    """(run_id, version) of succeeded runs that analysed rows, committed after version `after`, in commit order."""
    sql = (
        "SELECT run_id, commit_seq FROM job_runs WHERE status = 'succeeded' AND rows_analysed > 0"
        " AND commit_seq IS NOT NULL"
    )
    params: tuple[Any, ...] = ()
    if after is not None:
        sql += " AND commit_seq > %s"
        params = (after,)
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql + " ORDER BY commit_seq, run_id", params)
        return [(str(r[0]), int(r[1])) for r in cur.fetchall()]


def _watermark(cfg: QwenSparkConfig) -> int | None:
    try:
        return table_version(cfg.delta.path, cfg.delta.app_id)
    except ImportError:
        if cfg.delta.writer == "spark":  # no deltalake extra: the watermark is unknown, delta-spark dedups
            return None
        raise


def _has_deltalake() -> bool:
    from importlib.util import find_spec

    return find_spec("deltalake") is not None


def backfill_delta(cfg: QwenSparkConfig) -> int:
    """Append every committed run the Delta table lacks (newer than its watermark), oldest first; returns runs.

    With writer=spark and no deltalake installed the watermark is unknown: every committed run is handed to
    delta-spark, which skips the versions it already holds.
    """
    watermark = _watermark(cfg)
    written = 0
    for run_id, version in _committed_runs(cfg, watermark):
        # A run's rows that a later run has since re-analysed are no longer in review_sentiment under its
        # run_id: a late copy holds only what the run still owns (the later run's copy holds the rest).
        rows = run_rows(cfg, run_id)
        if rows.num_rows and write_delta(rows, cfg.delta, app_id=cfg.delta.app_id, version=version):
            written += 1
    return written


COPY_LOCK = "qwenspark.delta."  # + the table's path (hashed): one copy appends to a Delta table at a time
COPY_LOCK_TIMEOUT_S = 600


@contextmanager
def _copy_lock(cfg: QwenSparkConfig) -> Iterator[None]:
    """Serialise the copies of the drivers that share a Delta table (a batch and a stream committing together
    would otherwise both find a run above the watermark and append it twice, or fail on the app transaction)."""
    name = COPY_LOCK + hashlib.sha256(cfg.delta.path.encode()).hexdigest()[:40]
    busy = f"another Delta copy held {cfg.delta.path} for {COPY_LOCK_TIMEOUT_S} s"
    with mysql.connect(cfg.db, autocommit=True) as conn, \
            mysql.named_lock(conn, name, COPY_LOCK_TIMEOUT_S, lambda: TimeoutError(busy)):
        yield


def copy_after_commit(cfg: QwenSparkConfig, run_id: str) -> bool:
    """After run_id committed in MySQL: bring the Delta table up to date; never raises (see below)."""
    # MySQL is the system of record and the run is already committed and visible; failing the run now would
    # mark a committed run 'failed' and make callers retry work that is done. So a Delta error is logged and
    # recorded in job_runs.message, and the next run (or backfill_delta) catches up: the watermark is the
    # table's app-transaction version, so every committed run above it is appended in commit order.
    try:
        version = run_version(cfg, run_id)
        if version is None:
            raise ValueError(f"run {run_id} has no commit_seq in job_runs: it has not committed")
        with _copy_lock(cfg):
            watermark = _watermark(cfg)
            if watermark is not None and version <= watermark:
                # Versions follow commit order: another driver's catch-up, which copies every committed run
                # above the watermark in that order, has already appended this one.
                log.info("delta: run %s (version %d) is in the table already (at %d)", run_id, version, watermark)
                return True
            if cfg.delta.writer == "spark" and not _has_deltalake():
                # Without a watermark a catch-up would re-read every run ever committed: copy this run only.
                return write_delta(run_rows(cfg, run_id), cfg.delta, app_id=cfg.delta.app_id, version=version)
            runs = backfill_delta(cfg)
        if runs > 1:
            log.info("delta: caught up %d earlier runs", runs - 1)
        return True
    except Exception as exc:
        log.exception("delta copy of run %s failed; MySQL holds the results, the next run catches up", run_id)
        try:
            with mysql.connect(cfg.db, autocommit=True) as conn:
                mysql.update_run(conn, run_id, {"message": f"delta copy failed: {type(exc).__name__}: {exc}"[:4000]})
        except Exception:  # the log line above already says what went wrong
            log.exception("could not record the delta failure of run %s", run_id)
        return False
