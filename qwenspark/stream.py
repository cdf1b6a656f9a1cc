"""Driver side of the streaming job: source -> foreachBatch (one exactly-once run per micro-batch) + keepalive."""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from qwenspark.config import QwenSparkConfig
from qwenspark.engines.cache import PROBE_SCHEMA, probe_workers
from qwenspark.faults import failpoint
from qwenspark.io import migrate, mysql
from qwenspark.io.mysql import Connection
from qwenspark.io.stream_source import CORRUPT, read_stream, reject_json
from qwenspark.pipeline import RunSummary, Selection, run_tracked
from qwenspark.schemas import HOTEL_ID_MAX_CHARS, INPUT_SCHEMA
from qwenspark.session import check_spark_conf

log = logging.getLogger(__name__)


# How often a running stream deletes history past job.retention_days (and once as it starts).
RETENTION_EVERY_S = 3600.0


def job_name(cfg: QwenSparkConfig) -> str:
    """job_runs.job of the query's micro-batch runs."""
    return f"stream:{cfg.stream.query_name}"


@dataclass
class StreamReport:
    """What a streaming query did while this driver ran it."""

    query_id: str = ""
    batches_committed: int = 0
    batches_replayed: int = 0
    rows_in: int = 0
    rows_analysed: int = 0
    rows_rejected: int = 0
    keepalive_probes: int = 0
    runs_abandoned: int = 0
    # Summed over the batches (not a list of them: a stream runs for weeks).
    loads_per_worker: dict[str, int] = field(default_factory=dict)

    @property
    def engine_loads(self) -> int:
        """Engine loads over every batch this driver ran."""
        return sum(self.loads_per_worker.values())


class BatchSink:
    """foreachBatch target: a new micro-batch becomes one tracked run; one already committed is skipped."""

    def __init__(self, cfg: QwenSparkConfig, report: StreamReport, *, unique_ids: bool = False) -> None:
        self.cfg = cfg
        self.report = report
        self.unique_ids = unique_ids  # the source guarantees one row per review_id (the mysql source)
        self.busy = threading.Lock()  # the keepalive probe never runs beside a batch
        self.last_active = time.monotonic()
        self._bound = threading.Event()
        self.purged_at = time.monotonic()  # run_stream applies the retention as the query starts

    def bind(self, query_id: str) -> None:
        """Set the query id (known once start() returns; the first batch may already be waiting for it)."""
        self.report.query_id = query_id
        self._bound.set()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if not self._bound.wait(timeout=300):
            raise RuntimeError("streaming query id never bound")
        with self.busy:
            try:
                self._process(df, batch_id)
            finally:
                self.last_active = time.monotonic()

    def _process(self, df: DataFrame, batch_id: int) -> None:
        if time.monotonic() - self.purged_at >= RETENTION_EVERY_S:  # a stream runs for weeks
            mysql.apply_retention(self.cfg.db, self.cfg.job.retention_days)
            self.purged_at = time.monotonic()
        query_id = self.report.query_id
        retries = self.cfg.stream.batch_retries
        for attempt in range(retries + 1):
            # Checked before every attempt: a COMMIT can succeed although its acknowledgement was lost.
            if mysql.batch_committed(self.cfg.db, query_id, batch_id):
                # The driver died after the database commit and before Spark's: the results are in already.
                log.info("batch %d of query %s is committed already (a replay): skipped", batch_id, query_id)
                self.report.batches_replayed += 1
                return
            try:
                self._run(df, batch_id)
                return
            except Exception as exc:
                if attempt == retries:
                    raise
                pause = min(30.0, 2.0 * 2**attempt)
                log.warning("batch %d failed (%s: %s); retry %d/%d in %.0f s", batch_id, type(exc).__name__, exc,
                            attempt + 1, retries, pause)
                time.sleep(pause)

    def _run(self, df: DataFrame, batch_id: int) -> None:
        cfg = self.cfg
        extra = [F.col(CORRUPT)] if CORRUPT in df.columns else []
        # try_cast: under ANSI mode (Spark 4's default) a value of a given source that does not fit raises and
        # would stop the stream for good; as NULL it is handled per row (a NULL review_id is a reject).
        typed = df.select(*(F.col(f.name).try_cast(f.dataType).alias(f.name) for f in INPUT_SCHEMA.fields), *extra)
        keyed, rejects = (typed, []) if self.unique_ids else _split_rejects(typed)
        keyed = keyed.persist()
        try:
            lo, hi, rows = keyed.agg(F.min("review_id"), F.max("review_id"), F.count(F.lit(1))).first() or (None,) * 3
            rows = int(rows or 0)
            sel = Selection(keyed if rows else None, int(lo or 0), int(hi if hi is not None else -1), rows)

            def record(conn: Connection, summary: RunSummary) -> None:
                failpoint("stream.before_commit", batch_id)
                mysql.record_batch(
                    conn,
                    {
                        "query_id": self.report.query_id,
                        "batch_id": batch_id,
                        "query_name": cfg.stream.query_name,
                        "run_id": summary.run_id,
                        "rows_in": rows + len(rejects),
                        "rows_selected": rows,
                        "rows_analysed": summary.rows_analysed,
                        "rows_rejected": len(rejects),
                        "first_review_id": lo,
                        "last_review_id": hi,
                    },
                    rejects,
                )

            summary = run_tracked(df.sparkSession, cfg, job_name(cfg), lambda: sel, on_commit=record)
        finally:
            keyed.unpersist()
        failpoint("stream.after_commit", batch_id)
        rep = self.report
        rep.batches_committed += 1
        rep.rows_in += rows + len(rejects)
        rep.rows_analysed += summary.rows_analysed
        rep.rows_rejected += len(rejects)
        for pid, loads in summary.loads_per_worker.items():
            rep.loads_per_worker[pid] = rep.loads_per_worker.get(pid, 0) + loads
        log.info(
            "batch %d committed: %d rows in (%d analysed, %d rejected), %d changed, engine loads %d, %.1f s",
            batch_id, rows + len(rejects), summary.rows_analysed, len(rejects), summary.rows_changed,
            summary.engine_loads, summary.seconds_total,
        )


def _reject_reason(typed: DataFrame) -> Column:
    """Why a row cannot be analysed as it is (NULL: it can): it does not parse, has no id, or holds a value that
    would overflow a result column. (A language tag does not: clean normalises it to one that fits.)"""
    malformed = F.col(CORRUPT).isNotNull() if CORRUPT in typed.columns else F.lit(False)
    return (
        F.when(malformed, F.lit("malformed record"))
        .when(F.col("review_id").isNull(), F.lit("no review_id"))
        .when(F.length("hotel_id") > HOTEL_ID_MAX_CHARS, F.lit(f"hotel_id longer than {HOTEL_ID_MAX_CHARS} characters"))
        .otherwise(F.lit(None).cast("string"))
    )


def _split_rejects(typed: DataFrame) -> tuple[DataFrame, list[tuple[str, str]]]:
    """(rows with a usable, unique review_id; the others as (reason, raw JSON))."""
    # A landing file (or a CDC topic) may hold lines that do not parse, lack ids, repeat one or hold values no
    # result column can store: one row per id is analysed (the newest), the others are kept aside whole.
    usable = typed.withColumn("_reject", _reject_reason(typed))
    order = Window.partitionBy("review_id", F.col("_reject").isNotNull()).orderBy(
        F.col("created_at").desc_nulls_last(), F.col("text")
    )
    ranked = usable.withColumn("_n", F.row_number().over(order)).persist()
    try:
        rejects = []
        for row in ranked.where(F.col("_reject").isNotNull() | (F.col("_n") > 1)).collect():
            raw = {k: v for k, v in row.asDict().items() if k not in ("_reject", "_n")}
            rejects.append((row["_reject"] or "review_id repeated in the batch", reject_json(raw)))
        keyed = ranked.where(F.col("_reject").isNull() & (F.col("_n") == 1)).select(*INPUT_SCHEMA.fieldNames())
        # Materialise before the ranked cache goes: keyed is persisted by the caller.
        return keyed.localCheckpoint(eager=True), rejects
    finally:
        ranked.unpersist()


class Keepalive:
    """While the query is idle, run a one-row Python task per executor every `every` seconds.

    Spark's PythonWorkerFactory stops idle Python workers once a minute has passed without any worker being
    taken or returned (a fixed timeout, no setting). The engine lives in such a worker; a tiny task keeps the
    factory active, so the loaded engine survives quiet periods of any length.
    """

    def __init__(self, spark: SparkSession, sink: BatchSink, report: StreamReport, every: float) -> None:
        self.spark, self.sink, self.report, self.every = spark, sink, report, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="qwenspark-keepalive", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.wait(self.every / 4):
            if time.monotonic() - self.sink.last_active < self.every or not self.sink.busy.acquire(blocking=False):
                continue
            try:
                workers = probe(self.spark)
                self.report.keepalive_probes += 1
                log.debug("keepalive: python workers %s", workers)
            except Exception as exc:  # a failed probe must not stop the stream; the next one may work
                log.warning("keepalive probe failed: %s", exc)
            finally:
                self.sink.last_active = time.monotonic()
                self.sink.busy.release()


def probe(spark: SparkSession) -> dict[int, int]:
    """One Python task per executor; returns {worker pid: engines loaded in it}."""
    sc = spark.sparkContext
    executors = max(1, len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1)  # minus the driver
    sc.setJobDescription("qwenspark keepalive")
    try:
        rows = (
            spark.range(0, executors, 1, executors)
            .mapInPandas(probe_workers, PROBE_SCHEMA)  # type: ignore[arg-type]
            .collect()
        )
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    return {int(r["pid"]): int(r["engines"]) for r in rows}


def run_stream(
    spark: SparkSession,
    cfg: QwenSparkConfig,
    stop: threading.Event | None = None,
    source: DataFrame | None = None,
) -> StreamReport:
    """Run the streaming query until it ends (available_now), fails, `stop` is set, or SIGTERM/SIGINT arrives.

    `source`: any streaming DataFrame with INPUT_SCHEMA's columns (e.g. parsed Debezium events from Kafka)
    instead of the configured one; its rows are checked for missing and repeated review_ids.
    """
    check_spark_conf(spark, cfg)
    st = cfg.stream
    migrate.require_current(cfg.db)  # runs use DML only: schema changes are init-db's
    report = StreamReport()
    report.runs_abandoned = mysql.abandon_runs(cfg.db, job_name(cfg))
    if report.runs_abandoned:
        log.warning("%d micro-batch runs of an earlier driver never committed: marked failed, their batches "
                    "are replayed", report.runs_abandoned)
    mysql.apply_retention(cfg.db, cfg.job.retention_days)
    sink = BatchSink(cfg, report, unique_ids=source is None and st.source == "mysql")
    writer = (
        (source if source is not None else read_stream(spark, cfg))
        .writeStream.queryName(st.query_name)
        .option("checkpointLocation", st.checkpoint_location)
        .foreachBatch(sink)
    )
    # Not trigger(availableNow=True): Spark runs Python sources under it as one unbounded batch (Trigger.Once).
    writer = writer.trigger(processingTime=f"{st.trigger_seconds} seconds")
    stop = stop or threading.Event()
    restore = _stop_on_signals(stop)
    query = writer.start()
    sink.bind(str(query.id))
    log.info("streaming query %s (id %s) started from %s, checkpoint %s", st.query_name, query.id, st.source,
             st.checkpoint_location)
    keepalive = None
    if st.keepalive_seconds and not st.available_now:
        keepalive = Keepalive(spark, sink, report, st.keepalive_seconds)
        keepalive.start()
    try:
        while not query.awaitTermination(1):
            if stop.is_set() or (st.available_now and _caught_up(query.status, query.lastProgress, sink)):
                log.info("stopping streaming query %s", st.query_name)
                query.stop()
        if query.exception() is not None:
            raise query.exception()  # type: ignore[misc]
    finally:
        if keepalive is not None:
            keepalive.stop()
        if query.isActive:
            query.stop()
        restore()
    return report


def _caught_up(status: dict[str, Any], last_progress: dict[str, Any] | None, sink: BatchSink) -> bool:
    """available_now: a trigger has run, the last one found no new data, and no batch is in flight."""
    return (
        last_progress is not None
        and not status.get("isDataAvailable", True)
        and not status.get("isTriggerActive", True)
        and not sink.busy.locked()
    )


def _stop_on_signals(stop: threading.Event) -> Any:
    """SIGTERM/SIGINT set `stop` (the query then stops between polls); returns a function restoring the old ones."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    return lambda: [signal.signal(s, h) for s, h in old.items()]
