"""Streaming pieces without Spark: id-range splitting, the gap hold, the catch-up test, failpoints, config."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from qwenspark.config import load_config
from qwenspark.errors import ConfigError
from qwenspark.io.stream_source import settled_end, split_range


@pytest.mark.parametrize(("lo", "hi", "parts"), [(0, 10, 3), (-1, 0, 4), (5, 1005, 7), (10, 12, 8), (100, 100, 2)])
def test_split_range_covers_exactly(lo: int, hi: int, parts: int) -> None:
    ranges = split_range(lo, hi, parts)
    covered = [i for r in ranges for i in range(r.lo + 1, r.hi + 1)]
    assert covered == list(range(lo + 1, hi + 1)), "every id once, in order, none outside"
    assert len(ranges) <= parts


def test_settled_end_without_gaps_takes_everything() -> None:
    assert settled_end(0, [1, 2, 3], {}, now=10.0, wait=5.0) == 3
    assert settled_end(0, [], {}, now=10.0, wait=5.0) == 0


def test_settled_end_holds_a_young_gap_then_passes_it() -> None:
    gaps: dict[int, float] = {}
    # id 3 is missing: perhaps a transaction that has not committed yet
    assert settled_end(0, [1, 2, 4, 5], gaps, now=100.0, wait=5.0) == 2
    assert gaps == {4: 100.0}
    assert settled_end(2, [4, 5], gaps, now=103.0, wait=5.0) == 2, "still young"
    # the late transaction commits: no gap any more, and the remembered one is forgotten
    assert settled_end(2, [3, 4, 5], gaps, now=104.0, wait=5.0) == 5
    assert gaps == {}


def test_settled_end_passes_an_old_gap_and_can_be_switched_off() -> None:
    gaps: dict[int, float] = {}
    assert settled_end(0, [1, 4, 9], gaps, now=0.0, wait=5.0) == 1
    assert settled_end(1, [4, 9], gaps, now=5.0, wait=5.0) == 4, "the gap before 9 is first seen only now"
    assert settled_end(4, [9], gaps, now=10.0, wait=5.0) == 9
    assert settled_end(0, [1, 4, 9], {}, now=0.0, wait=0.0) == 9


def test_caught_up_needs_a_finished_idle_trigger_and_no_batch_in_flight() -> None:
    from qwenspark.stream import BatchSink, StreamReport, _caught_up

    cfg = load_config(None, ["engine.model=m"])
    sink = BatchSink(cfg, StreamReport())
    idle = {"isDataAvailable": False, "isTriggerActive": False}
    assert not _caught_up(idle, None, sink), "no trigger has run yet"
    assert _caught_up(idle, {"batchId": 3}, sink)
    assert not _caught_up({**idle, "isDataAvailable": True}, {"batchId": 3}, sink)
    with sink.busy:
        assert not _caught_up(idle, {"batchId": 3}, sink)
    assert isinstance(sink.busy, type(threading.Lock()))


def test_failpoint_kills_only_at_its_name_and_key() -> None:
    code = "from qwenspark.faults import failpoint; failpoint('a', 1); failpoint('b', 2); print('alive')"
    def run(value: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "QWENSPARK_FAILPOINT": value}
        return subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True)

    assert run("").stdout.strip() == "alive"
    assert run("b:3").stdout.strip() == "alive"
    assert run("b:2").returncode == -9
    assert run("a").returncode == -9


def test_stream_config_checks_the_query_name() -> None:
    cfg = load_config(None, ["engine.model=m", "stream.start_after_id=latest"])
    assert cfg.stream.start_after_id == "latest"
    assert load_config(None, ["engine.model=m", "stream.start_after_id=41"]).stream.start_after_id == 41
    with pytest.raises(ConfigError, match=r"stream\.query_name"):
        load_config(None, ["engine.model=m", "stream.query_name=has space"])
    # stream settings do not change what a result is: the config hash ignores them
    assert cfg.config_hash() == load_config(None, ["engine.model=m"]).config_hash()


def test_sink_retries_a_failed_batch_and_skips_a_committed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from qwenspark import stream

    cfg = load_config(None, ["engine.model=m", "stream.batch_retries=2"])
    sink = stream.BatchSink(cfg, stream.StreamReport())
    sink.bind("q")
    committed: set[int] = {7}
    attempts: list[int] = []

    def flaky_run(df: object, batch_id: int) -> None:
        attempts.append(batch_id)
        if len(attempts) == 1:
            raise ConnectionError("database restarting")
        committed.add(batch_id)

    monkeypatch.setattr(stream.mysql, "batch_committed", lambda db, q, b: b in committed)
    monkeypatch.setattr(stream.time, "sleep", lambda s: None)
    monkeypatch.setattr(sink, "_run", flaky_run)
    sink(None, 7)  # type: ignore[arg-type]
    assert attempts == [] and sink.report.batches_replayed == 1, "a committed batch never runs again"
    sink(None, 8)  # type: ignore[arg-type]
    assert attempts == [8, 8] and 8 in committed, "one failure, then the retry commits"

    def broken_run(df: object, batch_id: int) -> None:
        attempts.append(batch_id)
        raise ConnectionError("still down")

    monkeypatch.setattr(sink, "_run", broken_run)
    with pytest.raises(ConnectionError):
        sink(None, 9)  # type: ignore[arg-type]
    assert attempts.count(9) == 3, "batch_retries=2: three attempts, then the query fails"
