"""The streaming job on real Spark + MariaDB with the echo engine (tests/support/echo_engine.py): exactly once
across kills, poison rows, idle gaps. The model is not the point here: the ledger, the rejects and the Python
worker that keeps the cached engine through a quiet period are."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import mysql
from qwenspark.stream import StreamReport, run_stream
from tests.spark.conftest import ROOT, echo_records, query, recording, reset_tables

pytestmark = pytest.mark.spark


def _stream_cfg(cfg: QwenSparkConfig, tmp_path: Path, **stream: object) -> QwenSparkConfig:
    settings = {
        "checkpoint_location": str(tmp_path / "checkpoint"),
        "trigger_seconds": 1.0,
        "max_rows_per_batch": 4,
        "gap_wait_seconds": 0.0,  # one writer, ids in commit order
        **stream,
    }
    return cfg.model_copy(update={
        "stream": cfg.stream.model_copy(update=settings),
        "job": cfg.job.model_copy(update={"repartition": 2}),
    })


def _insert(cfg: QwenSparkConfig, rows: Iterable[tuple[int, str | None]]) -> None:
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
            " VALUES (%s, %s, '2026-11-29 12:00:00', 'en', NULL, %s)",
            [(rid, f"H{rid % 2}", text) for rid, text in rows],
        )


def _texts(dev: pd.DataFrame, ids: range) -> list[tuple[int, str | None]]:
    return [(rid, dev.text.iloc[rid]) for rid in ids]


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _results(cfg: QwenSparkConfig) -> int:
    return int(query(cfg, "SELECT COUNT(*) FROM review_sentiment")[0][0])


def _ledger_is_exact(cfg: QwenSparkConfig, ids: list[int]) -> list[tuple[object, ...]]:
    """Every review once, every batch once and contiguous, the ledger adding up; returns the ledger."""
    got = [r[0] for r in query(cfg, "SELECT review_id FROM review_sentiment ORDER BY review_id")]
    assert got == sorted(ids), "each review exactly once"
    ledger = query(cfg, "SELECT batch_id, rows_in, rows_analysed, first_review_id, last_review_id, run_id"
                        " FROM stream_commits ORDER BY batch_id")
    assert [r[0] for r in ledger] == list(range(len(ledger))), "no batch missing"
    assert sum(int(r[1]) for r in ledger) == len(ids), "rows delivered == reviews: none twice"
    spans = [(r[3], r[4]) for r in ledger if r[3] is not None]
    assert all(a[1] < b[0] for a, b in itertools.pairwise(spans)), "batches never overlap"
    runs = query(cfg, "SELECT run_id FROM job_runs WHERE job LIKE 'stream:%' AND status = 'succeeded'")
    assert sorted(r[0] for r in runs) == sorted(r[5] for r in ledger), "one committed run per batch"
    assert query(cfg, "SELECT COUNT(*) FROM review_sentiment_stage")[0][0] == 0
    return ledger


def test_stream_rows_inserted_while_running_poison_rows_and_an_idle_gap(
    spark: SparkSession, echo_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    records = tmp_path / "echo"
    cfg = _stream_cfg(recording(echo_cfg, records), tmp_path, keepalive_seconds=15.0)
    reset_tables(cfg)
    _insert(cfg, _texts(dev_reviews, range(1, 7)))
    stop = threading.Event()
    out: dict[str, StreamReport | BaseException] = {}

    def target() -> None:
        try:
            out["report"] = run_stream(spark, cfg, stop)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    try:
        _wait_for(lambda: _results(cfg) == 6, "the first 6 reviews")
        # Inserted while the query runs, with rows that must not stop it.
        poison = [(7, None), (8, "   "), (9, "😡" * 3), (10, "太长了" * 6000)]
        _insert(cfg, [*poison, *_texts(dev_reviews, range(11, 14))])
        _wait_for(lambda: _results(cfg) == 13, "the second wave with the poison rows")
        runs_before = {r[0] for r in query(cfg, "SELECT run_id FROM job_runs")}
        # A quiet period longer than Spark's 60 s idle-worker timeout, then one more review.
        time.sleep(75)
        gap_end = time.time()
        _insert(cfg, _texts(dev_reviews, range(14, 16)))
        _wait_for(lambda: _results(cfg) == 15, "the review after the idle gap")
    finally:
        stop.set()
        thread.join(timeout=120)
    assert "error" not in out, out.get("error")
    report = out["report"]
    assert isinstance(report, StreamReport)

    ledger = _ledger_is_exact(cfg, list(range(1, 16)))
    assert max(int(r[1]) for r in ledger) <= 4, "stream.max_rows_per_batch bounds every micro-batch"
    errors = dict(query(cfg, "SELECT review_id, error FROM review_sentiment WHERE review_id IN (7, 8, 10)"))
    assert errors[7] == "empty: text is NULL" and errors[8] == "empty: text is blank"
    assert query(cfg, "SELECT truncated FROM review_sentiment WHERE review_id = 10")[0][0] == 1

    # The engine outlived the idle gap: the batch after it loaded nothing, in the same worker processes.
    after_gap = query(cfg, "SELECT engine_loads FROM job_runs WHERE job LIKE 'stream:%' AND status = 'succeeded'"
                           f" AND run_id NOT IN ({','.join(repr(p) for p in runs_before)})")
    assert after_gap and all(int(r[0]) == 0 for r in after_gap), after_gap
    assert report.keepalive_probes >= 3, "the keepalive ran during the gap"
    loads = report.loads_per_worker
    assert set(loads.values()) <= {1} and len(loads) <= 2, f"one engine per worker, 2 workers at most: {loads}"
    # The engine's own record agrees: no load after the gap; every non-empty review sent to it once (7, 8 never).
    assert all(r["t"] < gap_end for r in echo_records(records, "load")), echo_records(records, "load")
    assert sum(r["rows"] for r in echo_records(records)) == 13
    daily = query(cfg, "SELECT SUM(reviews) FROM hotel_sentiment_daily")[0][0]
    assert int(daily) == 15, "aggregates follow the streamed rows"


def _job(cfg_file: Path, failpoint: str | None, log: Path) -> int:
    """The streaming job as users run it, in its own process group; returns its exit code."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "QWENSPARK_FAILPOINT": failpoint or ""}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "jobs" / "hotel_sentiment_stream.py"), "--config", str(cfg_file)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            code = proc.wait(timeout=400)
        finally:
            # A killed driver leaves its JVM behind for a moment: the whole "machine" goes down.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    return code


def test_kill9_before_and_after_the_commit_then_restart_exactly_once(
    echo_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    # The jobs' Python workers import the echo engine from the repo root: PYTHONPATH (tests/conftest.py) is inherited.
    cfg = _stream_cfg(echo_cfg, tmp_path, available_now=True, keepalive_seconds=0.0)
    reset_tables(cfg)
    cfg_file = tmp_path / "stream.yaml"
    cfg_file.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))
    _insert(cfg, _texts(dev_reviews, range(1, 15)))  # 14 reviews: batches of 4, 4, 4, 2

    # 1. killed inside batch 1's transaction, before COMMIT: batch 0 is in, batch 1 staged only
    assert _job(cfg_file, "stream.before_commit:1", tmp_path / "run1.log") == -signal.SIGKILL
    assert [r[0] for r in query(cfg, "SELECT batch_id FROM stream_commits")] == [0]
    assert query(cfg, "SELECT status FROM job_runs WHERE job LIKE 'stream:%' ORDER BY started_at") == [
        ("succeeded",), ("running",)]
    assert _results(cfg) == 4

    # 2. rows keep arriving; killed after batch 2's COMMIT, before Spark records the batch as done
    _insert(cfg, _texts(dev_reviews, range(15, 18)))
    assert _job(cfg_file, "stream.after_commit:2", tmp_path / "run2.log") == -signal.SIGKILL
    assert [r[0] for r in query(cfg, "SELECT batch_id FROM stream_commits ORDER BY 1")] == [0, 1, 2]

    # 3. a clean restart: batch 2 is replayed by Spark and found committed; the rest comes out once
    assert _job(cfg_file, None, tmp_path / "run3.log") == 0
    log3 = (tmp_path / "run3.log").read_text()
    assert "batch 2 of query" in log3 and "committed already (a replay): skipped" in log3, log3[-3000:]

    ledger = _ledger_is_exact(cfg, list(range(1, 18)))
    assert [int(r[1]) for r in ledger] == [4, 4, 4, 4, 1]
    abandoned = query(cfg, "SELECT message FROM job_runs WHERE status = 'failed'")
    assert len(abandoned) == 1 and "abandoned" in str(abandoned[0][0])
    assert query(cfg, "SELECT COUNT(*) FROM job_runs WHERE status = 'running'")[0][0] == 0
    # The password travels to the read tasks as a source option (as with Spark's JDBC source) but is never
    # written to the job's output or the checkpoint.
    secret = cfg.db.password().get_secret_value()
    written = [*tmp_path.glob("run*.log"), *(f for f in (tmp_path / "checkpoint").rglob("*") if f.is_file())]
    assert written and not [f for f in written if secret in f.read_text(errors="replace")]


def test_files_source_rejects_unkeyed_rows_and_loses_nothing(
    spark: SparkSession, echo_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    cfg = _stream_cfg(echo_cfg, tmp_path, source="files", files_path=str(landing), available_now=True,
                      keepalive_seconds=0.0, max_files_per_trigger=1)
    reset_tables(cfg)
    base = {"hotel_id": "H9", "created_at": "2026-11-28 08:00:00", "lang": "en", "rating": None}
    first = pd.DataFrame([{**base, "review_id": i, "text": dev_reviews.text.iloc[i]} for i in (101, 102, 103)])
    # a second file: one row without an id, one id twice (the newer is analysed), a multi-line review
    second = pd.DataFrame([
        {**base, "review_id": None, "text": "no id here"},
        {**base, "review_id": 104, "text": "first version"},
        {**base, "review_id": 104, "created_at": "2026-11-28 09:00:00", "text": "second,\nnewer version"},
        {**base, "review_id": 105, "text": "line one\nline two, with \"quotes\""},
    ])
    # JSON lines, the default landing format: fields by name, so a producer's column order does not matter
    for name, frame in (("a", first), ("b", second)):
        typed = frame.astype({"review_id": "Int64", "rating": "Int64"})  # ids as 104, not 104.0
        typed.to_json(landing / f"{name}.json", orient="records", lines=True, force_ascii=False)
    with (landing / "b.json").open("a") as f:
        f.write('{"review_id": 106, "text": "cut off in the middl\n')  # a line that does not parse

    report = run_stream(spark, cfg)
    rejects = query(cfg, "SELECT reason, raw FROM stream_rejects ORDER BY batch_id, seq")
    assert report.batches_committed == 2 and report.rows_in == 8 and report.rows_rejected == 3, rejects
    got = dict(query(cfg, "SELECT review_id, hotel_id FROM review_sentiment ORDER BY 1"))
    assert sorted(got) == [101, 102, 103, 104, 105]
    rejects = query(cfg, "SELECT reason, raw FROM stream_rejects ORDER BY batch_id, seq")
    assert sorted(r[0] for r in rejects) == ["malformed record", "no review_id", "review_id repeated in the batch"]
    assert any("first version" in str(r[1]) for r in rejects), "the older duplicate is kept aside, not lost"
    assert any("cut off in the middl" in str(r[1]) for r in rejects), "the raw line of a malformed record is kept"
    assert sum(int(r[0]) for r in query(cfg, "SELECT rows_in FROM stream_commits")) == 8
