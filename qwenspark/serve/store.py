"""serve.store: the service's answers committed into review_sentiment as a batch run commits them, so the batch and the
stream skip those reviews (same input_key) and the aggregates stay equal to a recount.

Answers are collected and committed every serve.store_flush_s as one job_runs run (job 'serve'): staged rows, then
mysql.commit_run (sql/upsert.sql: the staleness guard, the aggregates, the run's ledger row in the last transaction).
The response does not wait for the commit: a service that dies before a flush loses nothing but the shortcut (the
nightly run analyses those reviews), and a failed flush is logged and its run marked failed, never retried blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd

from qwenspark.config import QwenSparkConfig
from qwenspark.io import migrate, mysql
from qwenspark.pipeline import RunSummary
from qwenspark.schemas import RESULT_COLUMNS

log = logging.getLogger("qwenspark.serve")
_EPOCH = datetime(1970, 1, 1)  # naive UTC: the connection's session time zone is +00:00
_STAGE_COLUMNS = [c for c in RESULT_COLUMNS if c != "run_id"]


def _when(micros: Any) -> datetime | None:
    if micros is None or pd.isna(micros):
        return None
    return _EPOCH + timedelta(microseconds=int(micros))


def commit_answers(cfg: QwenSparkConfig, frame: pd.DataFrame) -> RunSummary:
    """Stage and commit a frame of result rows (analyze.PreparedBatch.frame) as one run; returns its summary."""
    summary = RunSummary(run_id=str(uuid.uuid4()), input_seq=mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
    started = time.perf_counter()
    rows = frame.drop_duplicates("review_id", keep="last")  # a review answered twice in one flush: the latest
    with mysql.run_lease(cfg.db, summary.run_id):
        mysql.insert_run(cfg.db, {
            "run_id": summary.run_id, "job": "serve", "status": "running", "config_hash": cfg.config_hash(),
            "model": cfg.engine.model, "prompt_version": cfg.prompt.version,
            "started_at": datetime.now(UTC).replace(tzinfo=None), "input_seq": summary.input_seq,
        })
        try:
            _stage(cfg, summary.run_id, rows)
            summary.rows_selected = summary.rows_analysed = len(rows)
            summary.rows_error = int(rows["error"].notna().sum())
            summary.rows_ok = len(rows) - summary.rows_error
            summary.rows_truncated = int(rows["truncated"].sum())
            summary.tokens_in, summary.tokens_out = int(rows["tokens_in"].sum()), int(rows["tokens_out"].sum())

            def finish(tx: Any, counts: mysql.Counts) -> None:
                summary.rows_changed, summary.rows_stale = counts
                summary.status, summary.seconds_total = "succeeded", time.perf_counter() - started
                summary.commit_seq = mysql.next_seq(tx, mysql.COMMIT_SEQ)
                mysql.update_run(tx, summary.run_id, {**summary.job_runs_fields(),
                                                      "finished_at": datetime.now(UTC).replace(tzinfo=None)},
                                 while_running=True)

            mysql.commit_run(cfg.db, summary.run_id, chunk_rows=cfg.sink.commit_chunk_rows,
                             input_seq=summary.input_seq, dedupe=False, finish=finish)
        except BaseException:
            with mysql.connect(cfg.db, autocommit=True) as conn:
                mysql.update_run(conn, summary.run_id, {"status": "failed"})
            mysql.delete_stage(cfg.db, summary.run_id)
            raise
    return summary


def _stage(cfg: QwenSparkConfig, run_id: str, rows: pd.DataFrame) -> None:
    cols = ", ".join(["run_id", *_STAGE_COLUMNS])
    marks = ", ".join(["%s"] * (len(_STAGE_COLUMNS) + 1))
    values = []
    for row in rows.to_dict("records"):
        record = {**row, "review_created_at": _when(row["review_created_at"]),
                  "analysed_at": _when(row["analysed_at"])}
        values.append([run_id, *(None if _missing(record[c]) else _plain(record[c]) for c in _STAGE_COLUMNS)])
    with mysql.connect(cfg.db) as conn, conn.cursor() as cur:
        cur.executemany(f"INSERT INTO review_sentiment_stage ({cols}) VALUES ({marks})", values)
        conn.commit()


def _missing(value: Any) -> bool:
    return value is None or (not isinstance(value, (str, datetime)) and bool(pd.isna(value)))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


class Store:
    """Answers collected by the handlers, committed every serve.store_flush_s in a worker thread."""

    def __init__(self, cfg: QwenSparkConfig) -> None:
        self.cfg = cfg
        self.pending: list[pd.DataFrame] = []
        self.runs: list[RunSummary] = []  # committed runs, newest last (tests and logs)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.to_thread(migrate.require_current, self.cfg.db)  # fail at start, not at the first flush
        self._task = asyncio.create_task(self._loop())

    async def put(self, frame: pd.DataFrame) -> None:
        """Queue a request's result rows (the rows with a content error too: the batch would store them alike)."""
        self.pending.append(frame)

    async def flush(self) -> None:
        """Commit what is queued (one run)."""
        if not self.pending:
            return
        frames, self.pending = self.pending, []
        batch = pd.concat(frames, ignore_index=True)
        try:
            summary = await asyncio.to_thread(commit_answers, self.cfg, batch)
        except Exception:  # logged, not retried: the nightly run analyses these reviews instead
            log.exception("serve.store: %d answer(s) could not be committed", len(batch))
            return
        self.runs.append(summary)
        log.info("serve.store: run %s committed %d answer(s), %d rows changed, %d stale", summary.run_id,
                 summary.rows_analysed, summary.rows_changed, summary.rows_stale)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.serve.store_flush_s)
            await self.flush()

    async def stop(self) -> None:
        """Stop the timer and commit what is left."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
