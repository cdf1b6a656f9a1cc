"""Many writers on one database (issue 10, finding 1): the stream and a batch at once over the same reviews and
(hotel, day) keys, the staleness guard, exact counts, commits that race, and Delta versions in commit order.

Real MariaDB (the `mariadb` fixture) and real Spark; the echo engine where a model runs (the model is not the point).
Rows are staged with mysql-connector as Spark's JDBC append would (tests/spark/test_sink_commit.py) where a test is
about the commit alone.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark import pipeline
from qwenspark.config import QwenSparkConfig
from qwenspark.io import delta, migrate, mysql
from qwenspark.pipeline import RunSummary, run_batch
from qwenspark.stream import StreamReport, job_name, run_stream
from tests.spark.conftest import (
    AGGREGATES,
    KEY_ORDER,
    as_owner,
    assert_consistent,
    load_reviews,
    query,
    reset_tables,
)
from tests.spark.test_sink_commit import Row, _expected, _result, _stage, _start_run, _stored

pytestmark = pytest.mark.spark



# ---------------------------------------------------------------------------------------------------- helpers








def _commit(cfg: QwenSparkConfig, rows: Sequence[Row], input_seq: int | None, chunk_rows: int = 50_000) -> RunSummary:
    """A run that read its input at version input_seq and analysed rows: staged, then pipeline._commit."""
    run_id = str(uuid.uuid4())
    _start_run(cfg, run_id)
    _stage(cfg, run_id, rows)
    cfg = cfg.model_copy(update={"sink": cfg.sink.model_copy(update={"commit_chunk_rows": chunk_rows})})
    summary = RunSummary(run_id=run_id, rows_analysed=len(rows), input_seq=input_seq)
    pipeline._commit(cfg, summary, time.perf_counter(), None)
    return summary


def _table(
    cfg: QwenSparkConfig, table: str, like: tuple[list[str], list[tuple[object, ...]]] | None = None
) -> tuple[list[str], list[tuple[object, ...]]]:
    """(columns, rows in key order) of a table; like: only the columns of an earlier read (columns added since
    are left out)."""
    cols = ", ".join(like[0]) if like else "*"
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT {cols} FROM {table} ORDER BY {KEY_ORDER.get(table, '1, 2')}")
        return list(cur.column_names), list(cur.fetchall())


def _run_row(cfg: QwenSparkConfig, run_id: str) -> tuple[object, ...]:
    return query(cfg, "SELECT status, rows_analysed, rows_changed, rows_stale, input_seq, commit_seq FROM job_runs"
                      f" WHERE run_id = '{run_id}'")[0]


# ---------------------------------------------------------------------------------------------------- the guard


def test_an_older_run_committing_after_a_newer_one_changes_nothing(echo_cfg: QwenSparkConfig) -> None:
    """The run that read its input first commits last: the reviews the newer run stored keep its results; the
    older run writes only the others, and counts the rest as stale (in job_runs too). Chunked and one-chunk."""
    cfg = echo_cfg
    reset_tables(cfg)
    rng = random.Random(11)
    older_seq = mysql.take_seq(cfg.db, mysql.INPUT_SEQ)
    newer_seq = mysql.take_seq(cfg.db, mysql.INPUT_SEQ)
    assert newer_seq > older_seq
    older = [_result(rng, i) for i in range(1, 25)]  # reviews 1..24
    newer = [_result(rng, i) for i in range(13, 37)]  # reviews 13..36: 12 in common

    first = _commit(cfg, newer, newer_seq)
    assert (first.rows_changed, first.rows_stale) == (24, 0)
    late = _commit(cfg, older, older_seq, chunk_rows=5)  # 5 chunks: the stale counts add up over chunks
    assert (late.rows_changed, late.rows_stale) == (12, 12)
    assert _run_row(cfg, late.run_id) == ("succeeded", 24, 12, 12, older_seq, late.commit_seq)
    assert late.commit_seq is not None and first.commit_seq is not None and late.commit_seq > first.commit_seq
    assert _stored(cfg) == _expected([*older[:12], *newer]), "reviews 13..24 keep the newer run's results"
    by_run = dict(query(cfg, "SELECT input_seq, COUNT(*) FROM review_sentiment GROUP BY input_seq"))
    assert by_run == {older_seq: 12, newer_seq: 24}
    assert_consistent(cfg)

    # A newer run committing after an older one replaces its rows, as always.
    newest = [_result(rng, i) for i in range(1, 7)]
    last = _commit(cfg, newest, mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
    assert (last.rows_changed, last.rows_stale) == (6, 0)
    assert _stored(cfg) == _expected([*older[:12], *newer, *newest])
    assert_consistent(cfg)


def test_a_run_that_read_a_review_before_its_purge_does_not_write_it_back(echo_cfg: QwenSparkConfig) -> None:
    """A run reads reviews 1..8; 7 and 8 are deleted from the source and purged; the run commits after the purge:
    it writes 1..6 and counts 7 and 8 stale (their tombstones are newer than its input), so a deleted review is
    not resurrected. Review 8 inserted again is written by a run that read it afterwards."""
    cfg = echo_cfg
    reset_tables(cfg)
    rng = random.Random(17)
    ids = range(1, 9)

    def source(sql: str, params: Sequence[tuple[int, ...]]) -> None:
        with mysql.connect(as_owner(cfg).db, autocommit=True) as conn, conn.cursor() as cur:  # the application
            cur.executemany(sql, params)

    insert = ("INSERT INTO hotel_reviews (review_id, hotel_id, created_at, text)"
              " VALUES (%s, 'H1', '2026-11-02 10:00:00', 'x')")
    source(insert, [(i,) for i in ids])
    first = _commit(cfg, [_result(rng, i) for i in ids], mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
    assert first.rows_changed == 8
    reader_seq = mysql.take_seq(cfg.db, mysql.INPUT_SEQ)  # a run reads 1..8 now ...
    late = [_result(rng, i) for i in ids]
    source("DELETE FROM hotel_reviews WHERE review_id = %s", [(7,), (8,)])  # ... 7 and 8 are deleted ...
    assert mysql.purge_deleted(cfg.db, cfg.source, chunk_rows=50_000) == 2
    done = _commit(cfg, late, reader_seq)  # ... and the run commits after the purge
    assert (done.rows_changed, done.rows_stale) == (6, 2)
    assert _stored(cfg) == _expected(late[:6]), "reviews 7 and 8 stay deleted"
    assert sorted(r for (r,) in query(cfg, "SELECT review_id FROM review_tombstones")) == [7, 8]
    assert_consistent(cfg)

    source(insert, [(8,)])  # review 8 comes back; a run that reads it after the purge writes it
    again = _commit(cfg, [late[7]], mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
    assert (again.rows_changed, again.rows_stale) == (1, 0)
    assert _stored(cfg) == _expected([*late[:6], late[7]])
    assert_consistent(cfg)


def test_commits_racing_past_the_commit_lock_count_and_aggregate_exactly(
    echo_cfg: QwenSparkConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two runs' chunks over the same 6 new reviews, both past their reads before either upserts (what two writers
    that do not share commit_run's named lock do). Before: the second counted rows_changed=9 for 6 rows and added
    its rows to the aggregates without taking the first one's out (11 reviews for 6). Now the second chunk sees the
    conflict in its affected rows, rolls back and runs again: the newer run's rows are stored, each run counts
    each review once (written or stale), and the aggregates equal a recompute."""
    cfg = echo_cfg
    reset_tables(cfg)
    rng = random.Random(5)
    seqs = [mysql.take_seq(cfg.db, mysql.INPUT_SEQ) for _ in range(2)]
    runs = {seq: (str(uuid.uuid4()), [_result(rng, i, hotels=2, days=2) for i in range(1, 7)]) for seq in seqs}
    for run_id, rows in runs.values():
        _start_run(cfg, run_id)
        _stage(cfg, run_id, rows)
    barrier = threading.Barrier(2, timeout=60)
    met: set[int] = set()

    def meet(name: str, key: object = None) -> None:
        # Both chunks have read the stored rows (none) before either upserts; a retried chunk goes on alone.
        if name == "sink.upsert" and threading.get_ident() not in met:
            met.add(threading.get_ident())
            barrier.wait()

    monkeypatch.setattr(mysql, "failpoint", meet)
    counts: dict[int, mysql.Counts] = {}
    errors: list[BaseException] = []

    def commit(seq: int) -> None:
        try:
            with mysql.connect(cfg.db) as conn:
                mysql._session(conn)
                counts[seq] = mysql._run_chunk(conn, runs[seq][0], (mysql.MIN_REVIEW_ID, mysql.MAX_REVIEW_ID), 100,
                                               True, input_seq=seq)
        except BaseException as exc:
            errors.append(exc)

    caplog.set_level(logging.WARNING, logger="qwenspark.io.mysql")
    threads = [threading.Thread(target=commit, args=(seq,)) for seq in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert "rolled back" in caplog.text, "the race happened: one chunk was rolled back and run again"
    older, newer = (counts[s] for s in seqs)
    assert newer.changed == 6 and newer.stale == 0
    assert older in (mysql.Counts(6, 0), mysql.Counts(0, 6)), older  # it went first, or it came second and lost
    assert _stored(cfg) == _expected(runs[seqs[1]][1]), "the newer run's results are stored"
    assert query(cfg, "SELECT SUM(reviews) FROM hotel_sentiment_daily")[0][0] == sum(
        1 for r in runs[seqs[1]][1] if r["hotel_id"] is not None and r["review_created_at"] is not None)
    assert_consistent(cfg)


def test_a_deadlock_in_a_one_chunk_commit_or_in_the_finish_is_retried(
    echo_cfg: QwenSparkConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit transaction is run again when InnoDB rolls it back (deadlock victim, lock wait timeout): the
    one-chunk commit (data, aggregates and job_runs in one transaction: every stream micro-batch) and the finish
    transaction of a chunked run. Before, only the chunks of a chunked run were retried and such a run failed."""
    cfg = echo_cfg
    reset_tables(cfg)
    rng = random.Random(29)
    real_update = mysql.update_run
    victims: list[str] = []

    def rolled_back_once(conn: object, run_id: str, fields: dict[str, object], *, while_running: bool = False) -> None:
        real_update(conn, run_id, fields, while_running=while_running)  # it ran: the rollback must undo it
        if while_running and run_id not in victims:  # the update to 'succeeded', inside the last transaction
            victims.append(run_id)
            errno = 1213 if len(victims) == 1 else 1205
            raise mysql.mysql.connector.errors.DatabaseError(msg=f"injected {errno}", errno=errno)

    monkeypatch.setattr(mysql, "update_run", rolled_back_once)
    one = [_result(rng, i) for i in range(1, 11)]
    single = _commit(cfg, one, mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
    chunked_rows = [_result(rng, i) for i in range(5, 31)]
    chunked = _commit(cfg, chunked_rows, mysql.take_seq(cfg.db, mysql.INPUT_SEQ), chunk_rows=7)
    assert victims == [single.run_id, chunked.run_id]
    assert _run_row(cfg, single.run_id) == ("succeeded", 10, 10, 0, single.input_seq, single.commit_seq)
    assert _run_row(cfg, chunked.run_id) == ("succeeded", 26, 26, 0, chunked.input_seq, chunked.commit_seq)
    assert _stored(cfg) == _expected([*one, *chunked_rows])
    assert_consistent(cfg)


# ---------------------------------------------------------------------------------------------------- Delta


def test_runs_sharing_an_app_id_reach_delta_whatever_their_clocks_and_copy_order(
    echo_cfg: QwenSparkConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Delta version is the run's commit_seq, taken inside its MySQL commit: a driver whose clock is an hour
    behind (before: its finished_at in ms was the version, below the table's, and the run was skipped forever) and
    copies made in the reverse of commit order all land, each run once."""
    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "delta")
    cfg = echo_cfg.model_copy(update={"delta": echo_cfg.delta.model_copy(update={"enabled": True, "path": path})})
    reset_tables(cfg)
    rng = random.Random(17)
    clock = iter([datetime(2026, 12, 1, 12), datetime(2026, 12, 1, 11), datetime(2026, 12, 1, 10),
                  datetime(2026, 12, 1, 9)])
    monkeypatch.setattr(pipeline, "_now", lambda: next(clock))  # every run's finished_at: an hour before the last
    runs = [_commit(cfg, [_result(rng, 10 * k + i) for i in range(1, 6)], mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
            for k in range(2)]
    # In commit order: the second run's finished_at is an hour below the first's.
    assert delta.copy_after_commit(cfg, runs[0].run_id)
    assert delta.copy_after_commit(cfg, runs[1].run_id)
    # Two more, copied in the reverse of commit order (two drivers whose copies ran late).
    runs += [_commit(cfg, [_result(rng, 10 * k + i) for i in range(1, 6)], mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
             for k in range(2, 4)]
    assert delta.copy_after_commit(cfg, runs[3].run_id)
    assert delta.copy_after_commit(cfg, runs[2].run_id), "already in the table: the later copy caught it up"

    seqs = [r.commit_seq for r in runs]
    assert all(s is not None for s in seqs) and seqs == sorted(seqs), seqs  # type: ignore[type-var]
    table = deltalake.DeltaTable(path)
    assert table.transaction_version(cfg.delta.app_id) == seqs[-1]
    got = table.to_pyarrow_table(columns=["run_id", "review_id"]).to_pandas()
    assert got.groupby("run_id").size().to_dict() == {r.run_id: 5 for r in runs}, "every run once"
    assert delta.backfill_delta(cfg) == 0


# ---------------------------------------------------------------------------------------------------- upgrade


def test_v003_keeps_data_and_carries_delta_versions_over(echo_cfg: QwenSparkConfig) -> None:
    """A database at v002 with runs and results in it: v003 loses nothing, gives each committed run the Delta
    version it had (its finished_at in epoch ms) and starts the commit sequence above every one of them."""
    cfg = echo_cfg
    reset_tables(cfg)
    rng = random.Random(3)
    _commit(cfg, [_result(rng, i) for i in range(1, 9)], None)
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:  # back to v002 (DDL: owner)
        cur.execute("DROP TABLE qwenspark_sequence")
        cur.execute("ALTER TABLE job_runs DROP COLUMN input_seq, DROP COLUMN commit_seq, DROP COLUMN rows_stale")
        cur.execute("ALTER TABLE review_sentiment DROP COLUMN input_seq")
        cur.execute(f"DELETE FROM {migrate.SCHEMA_TABLE} WHERE version = 3")
        cur.execute("UPDATE job_runs SET finished_at = '2026-11-30 12:00:00.123'")
        # A run from a driver whose clock ran ahead, and one that failed (no Delta version).
        for run_id, status, finished in (("ahead", "succeeded", "2030-01-01 00:00:00"), ("failed", "failed", None)):
            cur.execute("INSERT INTO job_runs (run_id, job, status, config_hash, model, prompt_version, started_at,"
                        " finished_at, rows_analysed) VALUES (%s, 'batch', %s, '0', 'm', 'v1', '2026-11-30', %s, 1)",
                        (run_id, status, finished))
    tables = ("review_sentiment", "job_runs", *AGGREGATES)
    before = {t: _table(cfg, t) for t in tables}
    with pytest.raises(migrate.SchemaVersionError, match="init-db"):
        migrate.require_current(cfg.db)

    assert migrate.migrate(cfg.db, views=False) == [3]
    migrate.require_current(cfg.db)
    assert before["review_sentiment"] and {t: _table(cfg, t, like=before[t]) for t in tables} == before
    assert query(cfg, "SELECT COUNT(*) FROM review_sentiment WHERE input_seq IS NULL")[0][0] == 8
    versions = dict(query(cfg, "SELECT run_id, commit_seq FROM job_runs"))
    ahead = 1893456000000  # 2030-01-01 in epoch ms
    assert versions.pop("ahead") == ahead and versions.pop("failed") is None
    assert set(versions.values()) == {1796040000123}  # 2026-11-30 12:00:00.123: delta.run_version of before
    start = int(query(cfg, "SELECT value FROM qwenspark_sequence WHERE name = 'commit'")[0][0])
    assert start >= ahead
    run = _commit(cfg, [_result(rng, i) for i in range(20, 23)], mysql.take_seq(cfg.db, mysql.INPUT_SEQ))
    assert run.commit_seq == start + 1
    assert migrate.migrate(cfg.db, views=False) == [], "nothing left to apply"


# ---------------------------------------------------------------------------------------------------- stream + batch


def _reviews(dev: pd.DataFrame, n: int) -> pd.DataFrame:
    """n real reviews over 3 hotels and 2 days: every (hotel, day) key gets reviews from several runs."""
    return pd.DataFrame({
        "review_id": range(1, n + 1),
        "hotel_id": [f"H{i % 3}" for i in range(n)],
        "created_at": [f"2026-11-{1 + i % 2:02d} 10:00:00" for i in range(n)],
        "lang": dev.lang.head(n).tolist(),
        "rating": [""] * n,
        "text": dev.text.head(n).tolist(),
    })


def test_stream_and_batch_at_once_over_the_same_reviews(
    spark: SparkSession,
    echo_cfg: QwenSparkConfig,
    dev_reviews: pd.DataFrame,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream (mysql source, 4 reviews a micro-batch) and a batch run analyse the same 24 reviews at the same
    time (job.reprocess: each run analyses all it reads). Each review's stored row comes from the newest run that
    analysed it (highest input_seq); every run either wrote or counted stale each review it analysed; the
    writes add up; the aggregates equal a recompute; no run failed.

    The batch starts once the stream has committed a micro-batch, and its commit waits until a micro-batch that
    read after it has committed: both interleavings happen whatever the machine's speed (an older result
    replaced by a newer one, and an older one arriving after a newer one)."""
    n = 24
    real_commit = pipeline._commit

    def batch_commits_late(cfg: QwenSparkConfig, summary: RunSummary, started: float, on_commit: object) -> None:
        if on_commit is None:  # the batch (a micro-batch records its ledger row on commit)
            deadline = time.monotonic() + 240
            while not query(cfg, f"SELECT COUNT(*) FROM job_runs WHERE job = '{job_name(cfg)}' AND status ="
                                 f" 'succeeded' AND input_seq > {summary.input_seq}")[0][0]:
                assert time.monotonic() < deadline, "no micro-batch read after the batch"
                time.sleep(0.2)
        real_commit(cfg, summary, started, on_commit)  # type: ignore[arg-type]

    monkeypatch.setattr(pipeline, "_commit", batch_commits_late)
    kwargs = {**echo_cfg.engine.engine_kwargs, "seconds_per_token": 0.01}  # a call of 4 reviews takes ~0.5 s
    cfg = echo_cfg.model_copy(update={
        "engine": echo_cfg.engine.model_copy(update={"engine_kwargs": kwargs}),
        "job": echo_cfg.job.model_copy(update={"reprocess": True, "repartition": 2}),
        "stream": echo_cfg.stream.model_copy(update={
            "checkpoint_location": str(tmp_path / "checkpoint"), "trigger_seconds": 1.0, "max_rows_per_batch": 4,
            "gap_wait_seconds": 0.0, "available_now": True, "keepalive_seconds": 0.0}),
    })
    reset_tables(cfg)
    load_reviews(cfg, _reviews(dev_reviews, n), tmp_path)
    out: dict[str, StreamReport | BaseException] = {}

    def stream() -> None:
        try:
            out["report"] = run_stream(spark, cfg)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        deadline = time.monotonic() + 240
        while not query(cfg, "SELECT COUNT(*) FROM stream_commits")[0][0]:  # the stream is under way
            assert time.monotonic() < deadline and thread.is_alive(), out
            time.sleep(0.2)
        batch = run_batch(spark, cfg)
    finally:
        thread.join(timeout=300)
    assert "error" not in out, out.get("error")
    assert batch.status == "succeeded" and batch.rows_analysed == n

    runs = query(cfg, "SELECT run_id, job, status, rows_analysed, rows_changed, rows_stale, input_seq, commit_seq"
                      " FROM job_runs ORDER BY commit_seq")
    assert {r[2] for r in runs} == {"succeeded"}, "no run failed"
    ledger = dict(query(cfg, "SELECT run_id, CONCAT(first_review_id, ',', last_review_id) FROM stream_commits"))
    stream_runs = [r for r in runs if r[1] == job_name(cfg)]
    assert len(stream_runs) == len(ledger) >= n // 4
    # Who analysed which review: the batch all of them, each micro-batch its contiguous range.
    analysed_by: dict[int, list[tuple[object, ...]]] = {i: [] for i in range(1, n + 1)}
    for r in runs:
        if r[1] == job_name(cfg):
            lo, hi = (int(v) for v in str(ledger[r[0]]).split(","))
            ids: Sequence[int] = range(lo, hi + 1)
        else:
            ids = range(1, n + 1)
        for i in ids:
            analysed_by[i].append(r)
    stored = dict(query(cfg, "SELECT review_id, run_id FROM review_sentiment"))
    assert sorted(stored) == list(range(1, n + 1))
    writes = stale = 0
    for review, by in analysed_by.items():
        assert len(by) == 2, (review, by)  # the batch and one micro-batch
        newest = max(by, key=lambda r: int(r[6]))  # type: ignore[call-overload]
        assert stored[review] == newest[0], f"review {review}: stored by {stored[review]}, newest was {newest[0]}"
        first, second = sorted(by, key=lambda r: int(r[7]))  # type: ignore[call-overload]
        newer_last = int(second[6]) > int(first[6])  # type: ignore[call-overload]
        writes += 1 + newer_last
        stale += not newer_last
    for r in runs:
        assert int(r[4]) + int(r[5]) == int(r[3]), f"run {r[0]}: every review written or stale: {r}"  # type: ignore[call-overload]
    assert sum(int(r[4]) for r in runs) == writes  # type: ignore[call-overload]
    assert sum(int(r[5]) for r in runs) == stale  # type: ignore[call-overload]
    # Both orders happened: the batch overwrote micro-batches that read before it, and lost to those that read after.
    assert 0 < stale < n and writes > n, (writes, stale)
    assert int(query(cfg, "SELECT SUM(reviews) FROM hotel_sentiment_daily")[0][0]) == n
    assert_consistent(cfg)
    assert query(cfg, "SELECT COUNT(*) FROM review_sentiment_stage")[0][0] == 0
    assert list(itertools.pairwise([int(r[7]) for r in runs])) and all(
        a < b for a, b in itertools.pairwise([int(r[7]) for r in runs])), "commit_seq: one per run, increasing"
