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
from qwenspark.errors import SinkError
from qwenspark.io import delta, jdbc, mysql
from qwenspark.io.mysql import Connection
from qwenspark.schemas import RESULT_SCHEMA
from qwenspark.session import check_spark_conf

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
    rows_changed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    engine_loads: int = 0
    engine_batches: int = 0
    seconds_total: float = 0.0
    seconds_analyse: float = 0.0
    batch_sizes: dict[str, int] = field(default_factory=dict)
    loads_per_worker: dict[str, int] = field(default_factory=dict)

    def job_runs_fields(self) -> dict[str, object]:
        """The columns of job_runs this summary fills."""
        skip = {"run_id", "batch_sizes", "loads_per_worker"}
        return {k: v for k, v in asdict(self).items() if k not in skip}


def prepare_model(cfg: QwenSparkConfig) -> QwenSparkConfig:
    """Fetch the embedded default model if asked, and make a local model path absolute for executors."""
    model = Path(cfg.engine.model)
    if cfg.engine.default_model:
        from qwenspark.models.default import ensure_default_model

        model = ensure_default_model(model.parent)
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
    )


def analyse(df: DataFrame, cfg: QwenSparkConfig, metrics: Metrics | None = None) -> DataFrame:
    """The transform shared by batch, eval and streaming: cleaned rows in, RESULT_SCHEMA rows out."""
    spec = AnalyzeSpec(
        engine=cfg.engine, prompt_version=cfg.prompt.version, max_review_tokens=cfg.clean.max_review_tokens
    )
    parts = cfg.job.repartition or df.sparkSession.sparkContext.defaultParallelism * 2
    # Batch size does not depend on partition size: analyze re-chunks the Arrow batches it gets.
    return df.repartition(parts).mapInPandas(make_analyze_fn(spec, metrics), RESULT_SCHEMA)


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

    return run_tracked(spark, cfg, job, select)


def run_tracked(
    spark: SparkSession,
    cfg: QwenSparkConfig,
    job: str,
    select: Callable[[], Selection],
    on_commit: CommitHook | None = None,
) -> RunSummary:
    """A job_runs-tracked run over select()'s rows; raises after marking the run failed if anything goes wrong."""
    started = time.perf_counter()
    summary = RunSummary(run_id=str(uuid.uuid4()))
    mysql.ensure_schema(cfg.db)
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
        },
    )
    log.info("run %s started (config %s)", summary.run_id, cfg.config_hash())
    try:
        _run(spark, cfg, summary, started, sel=select(), on_commit=on_commit)
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
) -> None:
    summary.rows_selected = sel.rows
    todo = None
    if sel.rows and sel.reviews is not None:
        cleaned = clean(sel.reviews, cfg)
        todo = skip_done(cleaned, jdbc.read_done(spark, cfg, sel.lo, sel.hi), cfg).persist()
        summary.rows_analysed = todo.count()
    summary.rows_skipped = sel.rows - summary.rows_analysed
    log.info(
        "%d reviews selected, %d already current, %d to analyse", sel.rows, summary.rows_skipped, summary.rows_analysed
    )
    try:
        if todo is not None and summary.rows_analysed:
            metrics = new_metrics(spark)
            log.info("analysing %d reviews with %s in batches of %d", summary.rows_analysed, cfg.engine.model,
                     cfg.engine.batch_size)
            t0 = time.perf_counter()
            results = analyse(todo, cfg, metrics).withColumn("run_id", F.lit(summary.run_id))
            jdbc.write_stage(results, cfg)
            summary.seconds_analyse = time.perf_counter() - t0
            summary.loads_per_worker = dict(metrics.engine_loads.value)
            summary.batch_sizes = dict(metrics.batch_sizes.value)
            summary.engine_loads = sum(summary.loads_per_worker.values())
            summary.engine_batches = sum(summary.batch_sizes.values())
        _commit(cfg, summary, started, on_commit)
        if cfg.delta.enabled and summary.rows_analysed:
            # After the commit, from what MySQL holds; a Delta failure never fails a committed run.
            delta.copy_after_commit(cfg, summary.run_id)
    finally:
        if todo is not None:
            todo.unpersist()


def _commit(cfg: QwenSparkConfig, summary: RunSummary, started: float, on_commit: CommitHook | None) -> None:
    """Reconcile counts, then upsert + bookkeeping (+ the caller's hook) in one transaction."""
    with mysql.connect(cfg.db) as conn:
        rows, distinct = mysql.stage_counts(conn, summary.run_id)
        if rows != summary.rows_analysed or distinct != rows:
            raise SinkError(
                f"reconciliation failed: {summary.rows_analysed} rows in, {rows} staged ({distinct} distinct ids)"
            )
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COALESCE(SUM(error IS NULL), 0), COALESCE(SUM(error IS NOT NULL), 0),"
                " COALESCE(SUM(truncated), 0), COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0)"
                " FROM review_sentiment_stage WHERE run_id = %s",
                (summary.run_id,),
            )
            ok, err, trunc, t_in, t_out = (int(v) for v in cur.fetchone())
        summary.rows_ok, summary.rows_error, summary.rows_truncated = ok, err, trunc
        summary.tokens_in, summary.tokens_out = t_in, t_out
        summary.rows_changed = mysql.upsert_run(conn, summary.run_id) if rows else 0
        summary.status = "succeeded"
        summary.seconds_total = time.perf_counter() - started
        mysql.update_run(conn, summary.run_id, {**summary.job_runs_fields(), "finished_at": _now()})
        if on_commit is not None:
            on_commit(conn, summary)
        conn.commit()
    log.info(
        "run %s committed: %d analysed (%d ok, %d errors), %d rows changed",
        summary.run_id,
        summary.rows_analysed,
        ok,
        err,
        summary.rows_changed,
    )


def _mark_failed(cfg: QwenSparkConfig, summary: RunSummary, exc: BaseException) -> None:
    try:
        mysql.delete_stage(cfg.db, summary.run_id)
        with mysql.connect(cfg.db, autocommit=True) as conn:
            fields = {
                **summary.job_runs_fields(),
                "finished_at": _now(),
                "message": f"{type(exc).__name__}: {exc}"[:4000],
            }
            mysql.update_run(conn, summary.run_id, fields)
    except Exception:  # the original error matters more than a failed bookkeeping update
        log.exception("could not mark run %s failed", summary.run_id)


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)
