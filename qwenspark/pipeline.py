"""Driver side of one run: select -> clean -> skip current -> mapInPandas -> stage -> one transaction."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from qwenspark.analyze import AnalyzeSpec, CounterParam, Metrics, make_analyze_fn
from qwenspark.clean import clean, skip_done
from qwenspark.config import QwenSparkConfig
from qwenspark.errors import QwenSparkError, SinkError, one_line
from qwenspark.faults import failpoint
from qwenspark.io import delta, jdbc, migrate, mysql
from qwenspark.io.mysql import Connection
from qwenspark.resources import IN_PROCESS_KINDS
from qwenspark.schemas import EXECUTOR_OUT_SCHEMA, from_executor, to_executor
from qwenspark.session import check_spark_conf
from qwenspark.slots import SlotPlan, plan_slots

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """What a run did; the same figures land in job_runs."""

    run_id: str
    status: str = "running"
    rows_selected: int = 0
    rows_skipped: int = 0
    rows_analysed: int = 0
    rows_ok: int = 0
    rows_error: int = 0
    rows_truncated: int = 0
    rows_changed: int = 0  # review_sentiment rows this run wrote
    rows_stale: int = 0  # reviews it analysed but did not write: a run that read newer input had stored them
    rows_purged: int = 0  # results of reviews gone from the source table, removed (job.purge_deleted)
    input_seq: int | None = None  # taken before the run read its input (the staleness guard of the commit)
    commit_seq: int | None = None  # taken inside its last commit transaction (commit order, the Delta version)
    tokens_in: int = 0
    tokens_out: int = 0
    engine_loads: int = 0
    engine_batches: int = 0
    seconds_total: float = 0.0
    seconds_analyse: float = 0.0
    batch_sizes: dict[str, int] = field(default_factory=dict)
    loads_per_worker: dict[str, int] = field(default_factory=dict)
    rows_per_engine: dict[str, int] = field(default_factory=dict)  # "pid:gpus" -> rows that engine analysed
    slots: int = 0
    partitions: int = 0
    rows_guarded: int = 0  # reviews the guard cut instructions to the model from (printed; not a job_runs column)
    rows_repaired: int = 0  # answers generated again, any retry kind (printed; not a job_runs column)

    def job_runs_fields(self) -> dict[str, object]:
        """The columns of job_runs this summary fills."""
        skip = {"run_id", "batch_sizes", "loads_per_worker", "rows_per_engine", "slots", "partitions", "rows_guarded",
                "rows_repaired"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


def prepare_model(cfg: QwenSparkConfig) -> QwenSparkConfig:
    """Fetch the pinned model engine.default_model selects, if any, and make a local model path absolute for
    executors."""
    model = Path(cfg.engine.model)
    if cfg.engine.default_model is not False:
        from qwenspark.models.default import ensure_model, pinned

        selected = pinned(cfg.engine.default_model)
        if selected is not None:
            model = ensure_model(model.parent, selected.name)
    if model.exists():
        engine = cfg.engine.model_copy(update={"model": str(model.resolve())})
        return cfg.model_copy(update={"engine": engine})
    return cfg


def new_metrics(spark: SparkSession) -> Metrics:
    """Fresh accumulators for one run."""
    sc = spark.sparkContext
    return Metrics(
        engine_loads=sc.accumulator({}, CounterParam()),
        batch_sizes=sc.accumulator({}, CounterParam()),
        rows=sc.accumulator(0),
        gpu_bindings=sc.accumulator({}, CounterParam()),
        engine_rows=sc.accumulator({}, CounterParam()),
        guarded=sc.accumulator(0),
        repaired=sc.accumulator(0),
    )


def analyse(
    df: DataFrame, cfg: QwenSparkConfig, metrics: Metrics | None = None, plan: SlotPlan | None = None
) -> DataFrame:
    """The transform shared by batch, eval and streaming: cleaned rows in, RESULT_SCHEMA rows out.

    The rows are spread over plan.partitions (slots x partitions_per_slot) so that every engine slot has work
    until the input is done; the mapInPandas stage carries the plan's ResourceProfile where the cluster manager
    supports it, so only this stage asks for GPUs and the engine's cores.
    """
    plan = plan or plan_slots(df.sparkSession, cfg)
    spec = AnalyzeSpec(
        engine=cfg.engine,
        prompt_version=cfg.prompt.version,
        max_review_tokens=cfg.clean.max_review_tokens,
        guard=cfg.prompt.guard,
        aspect_evidence=cfg.prompt.aspect_evidence,
        cores=plan.cores_per_slot if cfg.engine.kind in IN_PROCESS_KINDS else 0,
    )
    # Batch size does not depend on partition size: analyze re-chunks the Arrow batches it gets. Timestamps cross
    # Arrow as microseconds (schemas.to_executor): a DATETIME such as 9999-12-31 does not fit pandas' nanoseconds.
    analysed = to_executor(df).repartition(plan.partitions).mapInPandas(
        make_analyze_fn(spec, metrics), EXECUTOR_OUT_SCHEMA, profile=plan.profile
    )
    return from_executor(analysed)


@dataclass
class Selection:
    """The reviews a run covers: a DataFrame in INPUT_SCHEMA's columns and its review_id range."""

    reviews: DataFrame | None
    lo: int
    hi: int
    rows: int


# Called inside the run's transaction, after the upsert and before COMMIT (the stream records its batch).
CommitHook = Callable[[Connection, "RunSummary"], None]


def run_batch(spark: SparkSession, cfg: QwenSparkConfig, job: str = "batch") -> RunSummary:
    """One run of the batch job over the configured source rows."""
    check_spark_conf(spark, cfg)

    def select() -> Selection:
        # Read once, so the run's range is fixed at its start (rows inserted meanwhile wait for the next run).
        lo, hi, rows = jdbc.id_bounds(cfg)
        return Selection(jdbc.read_reviews(spark, cfg, lo, hi) if rows else None, lo, hi, rows)

    mysql.apply_retention(cfg.db, cfg.job.retention_days)  # old job_runs / stream_commits rows, DML only
    return run_tracked(spark, cfg, job, select, purge=cfg.job.purge_deleted)


def run_tracked(
    spark: SparkSession,
    cfg: QwenSparkConfig,
    job: str,
    select: Callable[[], Selection],
    on_commit: CommitHook | None = None,
    *,
    input_seq: int | None = None,
    purge: bool = False,
) -> RunSummary:
    """A job_runs-tracked run over select()'s rows; raises after marking the run failed if anything goes wrong.

    input_seq: the version of the run's input (mysql.INPUT_SEQ), taken before anything of it was read; taken here,
    before select(), when None. A caller that reads its input before calling (the stream) takes it itself.
    purge: first remove the results of reviews no longer in source.table (purge_deleted; batch runs only).

    The driver holds the run's lease (a named lock, mysql.run_lease) from before the run is recorded until it
    ends, and first marks failed the runs whose drivers died without committing (their leases are free),
    dropping their staged rows: a run killed with its database, or whose driver died, leaves nothing behind
    past the next start of any job.
    """
    started = time.perf_counter()
    summary = RunSummary(run_id=str(uuid.uuid4()))
    migrate.require_current(cfg.db)  # runs use DML only: schema changes are init-db's
    summary.input_seq = input_seq if input_seq is not None else mysql.take_seq(cfg.db, mysql.INPUT_SEQ)
    with mysql.run_lease(cfg.db, summary.run_id) as lease:
        mysql.insert_run(
            cfg.db,
            {
                "run_id": summary.run_id,
                "job": job,
                "status": "running",
                "config_hash": cfg.config_hash(),
                "model": cfg.engine.model,
                "prompt_version": cfg.prompt.version,
                "started_at": _now(),
                "input_seq": summary.input_seq,
            },
        )
        abandoned = mysql.abandon_runs(cfg.db)
        if abandoned:
            log.warning("%d earlier run(s) whose driver died before committing: marked failed, staged rows dropped",
                        abandoned)
        log.info("run %s started (config %s)", summary.run_id, cfg.config_hash())
        try:
            if purge:
                summary.rows_purged = mysql.purge_deleted(cfg.db, cfg.source, chunk_rows=cfg.sink.commit_chunk_rows)
                log.info("%d result(s) of reviews deleted from %s purged, with their share of the aggregates",
                         summary.rows_purged, cfg.source.table)
            _run(spark, cfg, summary, started, sel=select(), on_commit=on_commit, lease=lease)
        except BaseException as exc:
            summary.status = "failed"
            summary.seconds_total = time.perf_counter() - started
            _mark_failed(cfg, summary, exc)
            raise
    return summary


def _run(
    spark: SparkSession,
    cfg: QwenSparkConfig,
    summary: RunSummary,
    started: float,
    *,
    sel: Selection,
    on_commit: CommitHook | None,
    lease: Connection,
) -> None:
    summary.rows_selected = sel.rows
    todo = read = None
    if sel.rows and sel.reviews is not None:
        read = clean(sel.reviews, cfg).persist()
        failpoint("pipeline.read")  # the JDBC reads run in the counts below
        # What Spark read is what the run covers (rows inserted or deleted in the range since id_bounds counted
        # it change it): counted here, so that no review is ever reported "already current" without a match.
        summary.rows_selected = read.count()
        todo = skip_done(read, jdbc.read_done(spark, cfg, sel.lo, sel.hi), cfg).persist()
        summary.rows_analysed = todo.count()
        read.unpersist()
        if summary.rows_selected != sel.rows:
            log.warning("%d reviews counted in the range at the start, %d read: the source changed meanwhile",
                        sel.rows, summary.rows_selected)
    summary.rows_skipped = summary.rows_selected - summary.rows_analysed
    log.info(
        "%d reviews selected, %d already current, %d to analyse",
        summary.rows_selected, summary.rows_skipped, summary.rows_analysed,
    )
    metrics: Metrics | None = None
    try:
        if todo is not None and summary.rows_analysed:
            metrics = new_metrics(spark)
            plan = plan_slots(spark, cfg)
            summary.slots, summary.partitions = plan.slots, plan.partitions
            log.info("analysing %d reviews with %s in batches of %d", summary.rows_analysed, cfg.engine.model,
                     cfg.engine.batch_size)
            t0 = time.perf_counter()
            results = analyse(todo, cfg, metrics, plan).withColumn("run_id", F.lit(summary.run_id))
            # write_stage shuffles the analysed rows to its own partitions: the analysis tasks (one per slot at
            # a time) end by writing shuffle files, so a failed JDBC write task re-reads them and never runs
            # the model again.
            jdbc.write_stage(results, cfg)
            summary.seconds_analyse = time.perf_counter() - t0
            summary.rows_per_engine = dict(metrics.engine_rows.value)
            summary.rows_guarded = int(metrics.guarded.value)
            summary.rows_repaired = int(metrics.repaired.value)
            summary.loads_per_worker = dict(metrics.engine_loads.value)
            summary.batch_sizes = dict(metrics.batch_sizes.value)
            summary.engine_loads = sum(summary.loads_per_worker.values())
            summary.engine_batches = sum(summary.batch_sizes.values())
        if not mysql.lease_held(lease, summary.run_id):
            raise SinkError(f"run {summary.run_id} lost its database session (lease) before its commit: the server"
                            " restarted or dropped it; nothing of this run is committed, a rerun analyses it")
        _commit(cfg, summary, started, on_commit)
        if cfg.delta.enabled and summary.rows_analysed:
            # After the commit, from what MySQL holds; a Delta failure never fails a committed run.
            delta.copy_after_commit(cfg, summary.run_id)
    finally:
        if metrics is not None:
            metrics.release()  # a stream runs one of these per micro-batch, for weeks
        for frame in (read, todo):
            if frame is not None:
                frame.unpersist()


class ErrorRateExceeded(QwenSparkError):
    """Too many of a run's reviews came back from the model as errors: the run fails and commits nothing."""


# A run fails on its error rate only from this many model-side errors: one unparsable answer in a micro-batch of
# three must not stop a stream, while an outage or a broken model shows up in every row.
ERROR_RATE_FLOOR = 3


def check_error_rate(cfg: QwenSparkConfig, staged: mysql.StageSummary, run_id: str) -> None:
    """Fail the run (nothing committed) when the share of model-side errors exceeds job.max_error_rate."""
    limit = cfg.job.max_error_rate
    asked = staged.reviews - staged.input_errors
    errors = staged.model_errors
    if errors < ERROR_RATE_FLOOR or errors <= limit * asked:
        return
    with mysql.connect(cfg.db) as conn:
        common = "; ".join(f"{n} x {e!r}" for e, n in mysql.top_errors(conn, run_id))
    raise ErrorRateExceeded(
        f"{errors} of {asked} reviews sent to the model came back as errors ({errors / asked:.1%}, above "
        f"job.max_error_rate={limit:g}): nothing of this run is committed and a rerun tries them again. "
        f"Most frequent: {common}"
    )


def _commit(cfg: QwenSparkConfig, summary: RunSummary, started: float, on_commit: CommitHook | None) -> None:
    """Reconcile what was staged, then commit it in chunks; the last one holds job_runs and the caller's hook.

    Spark may stage a review twice (a write task retried after part of its rows were committed): the commit keeps
    the latest copy, and reconciliation compares the DISTINCT reviews staged with the rows the run analysed. The
    rows move in transactions of at most sink.commit_chunk_rows staged rows (mysql.commit_run has the semantics
    of a failure between chunks); the job_runs update to 'succeeded' and on_commit(conn, summary) run in the last
    transaction, before its COMMIT.
    """
    with mysql.connect(cfg.db) as conn:
        staged = mysql.stage_summary(conn, summary.run_id)
    if staged.reviews != summary.rows_analysed:
        raise SinkError(
            f"reconciliation failed: {summary.rows_analysed} rows in, {staged.reviews} reviews staged"
            f" ({staged.rows} rows, {staged.duplicates} duplicates)"
        )
    if staged.duplicates:
        log.warning("run %s: %d staged rows are older copies of reviews staged again (a retried write task):"
                    " dropped, the latest copy of each review is kept", summary.run_id, staged.duplicates)
    summary.rows_ok, summary.rows_error, summary.rows_truncated = staged.ok, staged.errors, staged.truncated
    summary.tokens_in, summary.tokens_out = staged.tokens_in, staged.tokens_out
    check_error_rate(cfg, staged, summary.run_id)

    committed = [mysql.Counts(0)]  # what the chunks committed so far wrote: job_runs keeps it if a later one fails

    def progress(counts: mysql.Counts) -> None:
        committed[0] = counts

    def finish(tx: Connection, counts: mysql.Counts) -> None:
        # Inside the last commit transaction, which is run again after a deadlock: everything here is repeatable.
        summary.rows_changed, summary.rows_stale = counts
        summary.status = "succeeded"
        summary.seconds_total = time.perf_counter() - started
        summary.commit_seq = mysql.next_seq(tx, mysql.COMMIT_SEQ)  # held locked until COMMIT: commit order
        mysql.update_run(tx, summary.run_id, {**summary.job_runs_fields(), "finished_at": _now()}, while_running=True)
        if on_commit is not None:
            on_commit(tx, summary)

    try:
        mysql.commit_run(
            cfg.db,
            summary.run_id,
            chunk_rows=cfg.sink.commit_chunk_rows,
            input_seq=summary.input_seq,
            dedupe=staged.duplicates > 0,
            finish=finish,
            progress=progress,
        )
    except BaseException:
        summary.commit_seq = None  # taken in a transaction that was rolled back
        summary.rows_changed, summary.rows_stale = committed[0]
        raise
    log.info(
        "run %s committed: %d analysed (%d ok, %d errors), %d rows changed, %d stale (a run that read newer input"
        " had stored them), %d duplicate staged rows dropped",
        summary.run_id,
        summary.rows_analysed,
        summary.rows_ok,
        summary.rows_error,
        summary.rows_changed,
        summary.rows_stale,
        staged.duplicates,
    )


def _mark_failed(cfg: QwenSparkConfig, summary: RunSummary, exc: BaseException) -> None:
    """Drop the run's remaining staged rows (bounded transactions) and record it failed with the error.

    Chunks the commit took before the failure stay committed (final results, see mysql.commit_run); their rows
    changed are kept in job_runs.rows_changed, and a rerun analyses only the reviews they did not cover.
    """
    try:
        mysql.delete_stage(cfg.db, summary.run_id, cfg.sink.commit_chunk_rows)
        message = f"{type(exc).__name__}: {exc}"
        if summary.rows_changed:
            message = f"{message} (chunks committed before the failure changed {summary.rows_changed} rows; they stay)"
        with mysql.connect(cfg.db, autocommit=True) as conn:
            fields = {
                **summary.job_runs_fields(),
                "finished_at": _now(),
                "message": message[:4000],
            }
            mysql.update_run(conn, summary.run_id, fields)
    except Exception as err:  # the original error matters more than a failed bookkeeping update
        # The next start of any job finds the run's lease free and marks it failed (mysql.abandon_runs).
        log.warning("could not mark run %s failed (%s); the next run will", summary.run_id, one_line(err))
        log.debug("marking run %s failed", summary.run_id, exc_info=True)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)
