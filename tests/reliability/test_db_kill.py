"""The database killed with SIGKILL at each phase of a batch run, restarted, and the job run again (issue 9, 5b).

Each phase: the batch job runs as users run it (`python -m qwenspark.cli batch`, its own Spark, so a dead database
cannot wedge this process's), on a MariaDB of this module's own (tests/reliability/dbserver.py). The database dies
  read      at the failpoint just before the Spark JDBC read runs (driver),
  analysis  at the first batch of each analysis task (executor: the Python worker runs the kill command),
  staging   when the run's first rows appear in review_sentiment_stage (watched from here; isolation NONE commits
            every JDBC batch, so they show while the write goes on),
  upsert    inside a chunk's open transaction: the only chunk (one transaction with the job_runs update), or the
            third of four (two committed before it, one maybe in flight beside it).
The run must fail (exit code not 0). The database restarts on the same data (InnoDB crash recovery) and the job
runs again, on this process's Spark (the database is up again; a second job process would double the phase's
time): it must succeed with each review exactly once in review_sentiment, the aggregates equal to a recount, no
job_runs row left 'running' (the killed run marked failed), no staged row left, and the engine (the echo engine's
own records, not the job's) given exactly the reviews the killed run did not commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mysql.connector import Error as DbError
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import mysql
from qwenspark.pipeline import run_batch
from tests.reliability.dbserver import ROOT, DbServer, aggregate_mismatches
from tests.spark.conftest import echo_records, query, recording, reset_tables

pytestmark = pytest.mark.spark

REVIEWS = 400
CHUNK = 100  # the multi-chunk upsert phase: 4 chunks of review_id 1-100, 101-200, 201-300, 301-400
JOB_TIMEOUT_S = 300


@dataclass(frozen=True)
class Phase:
    """Where the database dies, and how the run gets there."""

    name: str
    failpoint: str | None  # $QWENSPARK_FAILPOINT of the first run (None: this test kills the database itself)
    overrides: tuple[str, ...] = ()
    committed: tuple[int, ...] = (0,)  # reviews the killed run may have committed (whole chunks)


PHASES = (
    Phase("read", "pipeline.read"),
    Phase("analysis", "analyze.batch:0"),
    # One staged row per JDBC batch and commit: the write takes long enough to be caught in the middle.
    Phase("staging", None, ("sink.isolation_level=NONE", "sink.batchsize=1")),
    Phase("upsert-one-chunk", "sink.upsert"),
    # Chunk 3 starts at review_id 201; chunks 1 and 2 run before or beside it (two commit workers).
    Phase("upsert-third-chunk", f"sink.upsert:{2 * CHUNK + 1}", (f"sink.commit_chunk_rows={CHUNK}",),
          committed=(CHUNK, 2 * CHUNK)),
)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[DbServer]:
    """A MariaDB of this test's own (the session server must never die), on a new data folder for each phase: one
    kill and one crash recovery per folder, as one outage is. (On a folder that had been through three, MariaDB
    10.11 once crashed by itself, signal 11 in ha_maria::drop_table, on an information_schema query.)"""
    server = DbServer(tmp_path / "mariadb")
    server.start()
    try:
        yield server
    finally:
        if server.pid() is not None:
            server.stop()
        crashed = server.crashed()
        if crashed:
            pytest.fail(f"mariadbd crashed by itself (a server bug, not a kill of this test): {crashed}")


def _load(cfg: QwenSparkConfig, dev: pd.DataFrame) -> None:
    """REVIEWS real reviews as review_id 1..REVIEWS, over 8 hotels and 10 days."""
    rows = [(i, f"H{i % 8}", f"2026-11-{1 + i % 10:02d} {i % 24:02d}:00:00", dev.lang.iloc[i], None, dev.text.iloc[i])
            for i in range(1, REVIEWS + 1)]
    with mysql.connect(cfg.db.owner()) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
                        " VALUES (%s, %s, %s, %s, %s, %s)", rows)
        conn.commit()


def _job(cfg_file: Path, log: Path, env: dict[str, str], watch: Callable[[], bool] | None = None) -> int:
    """The batch job in its own process group; watch() is polled while it runs until it returns True."""
    cmd = [sys.executable, "-m", "qwenspark.cli", "batch", "--config", str(cfg_file)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYSPARK_PYTHON": sys.executable, **env},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + JOB_TIMEOUT_S
            while watch is not None and proc.poll() is None and time.monotonic() < deadline:
                if watch():
                    watch = None
                time.sleep(0.02)
            return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            # Nothing of the job outlives it (a Spark JVM left behind would hold memory and ports).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def _count(cfg: QwenSparkConfig, sql: str) -> int:
    return int(query(cfg, sql)[0][0])


def _stage_watch(db: DbServer, cfg: QwenSparkConfig, seen: dict[str, int]) -> Callable[[], bool]:
    """Kills the database once the run's first rows are staged; keeps how many it saw then."""

    def watch() -> bool:
        try:
            staged = _count(cfg, "SELECT COUNT(*) FROM review_sentiment_stage")
        except DbError:
            return False
        if not staged:
            return False
        db.kill9()
        seen["staged"] = staged
        return True

    return watch


@pytest.mark.parametrize("phase", PHASES, ids=lambda p: p.name)
def test_db_killed_restarted_and_rerun_lands_each_review_once(
    spark: SparkSession, db: DbServer, dev_reviews: pd.DataFrame, tmp_path: Path, phase: Phase
) -> None:
    cfg = db.config(["job.repartition=2", "source.num_partitions=2", *phase.overrides])
    # A faster JVM start for the job process (as the suite's own Spark session has).
    spark_conf = {**cfg.spark.conf, "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
    cfg = cfg.model_copy(update={"spark": cfg.spark.model_copy(update={"conf": spark_conf})})
    reset_tables(cfg)
    _load(cfg, dev_reviews)
    cfg_file = tmp_path / "batch.yaml"
    cfg_file.write_text(yaml.safe_dump(json.loads(cfg.model_dump_json())))

    # 1. the run during which the database dies
    seen: dict[str, int] = {}
    env = {"QWENSPARK_FAILPOINT": phase.failpoint or "", "QWENSPARK_FAILPOINT_EXEC": db.kill_command()}
    watch = _stage_watch(db, cfg, seen) if phase.failpoint is None else None
    killed_code = _job(cfg_file, tmp_path / "killed.log", env, watch)
    log = (tmp_path / "killed.log").read_text(errors="replace")
    assert killed_code != 0, f"the run whose database died exited 0:\n{log[-4000:]}"
    assert not db.alive(), "the database was not killed during the run"
    if phase.failpoint is not None:
        assert f"failpoint {phase.failpoint.split(':')[0]}" in log, log[-4000:]
    else:
        assert 0 < seen.get("staged", 0) < REVIEWS, f"not killed while staging: {seen}"

    # 2. restart on the same data: what the outage left
    db.start()
    runs = query(cfg, "SELECT run_id, status FROM job_runs")
    assert len(runs) == 1 and runs[0][1] == "running", f"the dead run stays 'running' until the next start: {runs}"
    killed_run = str(runs[0][0])
    committed = _count(cfg, "SELECT COUNT(*) FROM review_sentiment")
    assert committed in phase.committed, f"{committed} reviews committed, expected one of {phase.committed}"
    if committed:  # whole chunks (1 and/or 2; never the killed 3rd), aggregates that match them
        ids = {int(r[0]) for r in query(cfg, "SELECT review_id FROM review_sentiment")}
        chunks = {(i - 1) // CHUNK for i in ids}
        assert chunks <= {0, 1} and ids == {i for c in chunks for i in range(c * CHUNK + 1, (c + 1) * CHUNK + 1)}
        assert not aggregate_mismatches(cfg)
    staged_after_outage = _count(cfg, "SELECT COUNT(*) FROM review_sentiment_stage")
    if phase.name.startswith("upsert"):
        assert staged_after_outage == REVIEWS - committed, "the killed chunks' staged rows wait for the next start"
    elif phase.failpoint is None:
        assert staged_after_outage > 0, "rows staged before the kill are there after the restart"
    else:
        assert staged_after_outage == 0, "nothing was staged before the kill"

    # 3. the rerun, as the next night's run (it raises if it fails)
    records = tmp_path / "echo-rerun"
    run_batch(spark, recording(cfg, records))

    got = query(cfg, "SELECT COUNT(*), COUNT(DISTINCT review_id), MIN(review_id), MAX(review_id)"
                     " FROM review_sentiment")
    assert [tuple(int(v) for v in got[0])] == [(REVIEWS, REVIEWS, 1, REVIEWS)], "each review exactly once"
    assert _count(cfg, f"SELECT COUNT(*) FROM review_sentiment WHERE run_id = '{killed_run}'") == committed
    assert _count(cfg, "SELECT COUNT(*) FROM review_sentiment WHERE error IS NOT NULL") == 0
    mismatches = aggregate_mismatches(cfg)
    assert not mismatches, f"aggregates differ from a recount: {mismatches}"
    assert _count(cfg, "SELECT COALESCE(SUM(reviews), 0) FROM hotel_sentiment_daily") == REVIEWS
    statuses = dict(query(cfg, "SELECT run_id, status FROM job_runs"))
    assert statuses.pop(killed_run) == "failed", "the killed run is marked failed on the next start"
    assert list(statuses.values()) == ["succeeded"], statuses
    assert _count(cfg, "SELECT COUNT(*) FROM review_sentiment_stage") == 0, "no staged row left"
    # The engine's own records: the rerun analysed exactly what the killed run did not commit.
    assert sum(r["rows"] for r in echo_records(records)) == REVIEWS - committed
    print(f"\n[db kill] phase {phase.name}: killed run exit {killed_code}; after restart {committed} reviews committed,"
          f" {staged_after_outage} staged rows left; rerun analysed {REVIEWS - committed}; final {REVIEWS} reviews,"
          f" 0 staged, 0 running" + (f"; staged when killed: {seen['staged']}" if seen else ""))
