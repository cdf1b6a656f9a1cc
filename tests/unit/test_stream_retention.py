"""A stream that runs for weeks applies job.retention_days hourly, not only as it starts (no Spark, no database)."""

from __future__ import annotations

from typing import Any

import pytest

from qwenspark import stream
from qwenspark.config import load_config
from qwenspark.stream import BatchSink, StreamReport


def test_the_sink_purges_when_an_hour_has_passed_and_not_before(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(None, ["engine.model=m", "job.retention_days=7"])
    calls: list[int] = []
    monkeypatch.setattr(stream.mysql, "apply_retention", lambda db, days: calls.append(days))
    monkeypatch.setattr(stream.mysql, "batch_committed", lambda db, q, b: False)
    clock = [1000.0]
    monkeypatch.setattr(stream.time, "monotonic", lambda: clock[0])
    sink = BatchSink(cfg, StreamReport(query_id="q"))
    ran: list[int] = []
    monkeypatch.setattr(sink, "_run", lambda df, batch_id: ran.append(batch_id))
    df: Any = None
    sink._process(df, 0)
    clock[0] += stream.RETENTION_EVERY_S - 1
    sink._process(df, 1)
    assert calls == [] and ran == [0, 1], "run_stream purged at the start: not again within the hour"
    clock[0] += 1
    sink._process(df, 2)
    assert calls == [7] and ran == [0, 1, 2]
    sink._process(df, 3)
    assert calls == [7], "once per hour"
