"""The Delta copy through delta-rs: appends per (app_id, version), replays skipped, partitioned by day."""

from __future__ import annotations

import subprocess
import sys
from datetime import date, datetime
from pathlib import Path

import pandas as pd
import pytest

from qwenspark.config import DeltaConfig
from qwenspark.io.delta import to_delta_rows, write_delta
from qwenspark.schemas import RESULT_COLUMNS

deltalake = pytest.importorskip("deltalake")


def _batch(ids: range, run_id: str) -> pd.DataFrame:
    """Result rows as the pipeline makes them; review 3 has no created_at (its day is the analysed day)."""
    n = len(ids)
    return pd.DataFrame(
        {
            "review_id": list(ids),
            "hotel_id": [f"H{i % 2}" for i in ids],
            "review_created_at": [None if i == 3 else datetime(2026, 11, 1 + i % 3, 23, 30) for i in ids],
            "lang": ["zh"] * n,
            "input_key": [f"{i:064d}" for i in ids],
            "sentiment": [None if i == 4 else "positive" for i in ids],
            "summary": [None if i == 4 else f"summary {i}" for i in ids],
            "aspects": [None if i == 4 else '[{"aspect": "room", "sentiment": "positive"}]' for i in ids],
            "truncated": [False] * n,
            "error": ["empty: text is blank" if i == 4 else None for i in ids],
            "model": ["m"] * n,
            "prompt_version": ["v1"] * n,
            "tokens_in": [10] * n,
            "tokens_out": [5] * n,
            "latency_ms": [7] * n,
            "analysed_at": [datetime(2026, 11, 30, 12, 0)] * n,
            "run_id": [run_id] * n,
        }
    )


def test_two_batches_then_replay_is_skipped(tmp_path: Path) -> None:
    cfg = DeltaConfig(enabled=True, path=str(tmp_path / "delta"))
    assert write_delta(_batch(range(1, 6), "r1"), cfg, app_id="app", version=1)
    assert write_delta(_batch(range(6, 11), "r2"), cfg, app_id="app", version=2)
    assert not write_delta(_batch(range(1, 6), "r1"), cfg, app_id="app", version=1), "a replay is skipped"
    assert not write_delta(_batch(range(1, 6), "r1"), cfg, app_id="app", version=2)
    # another app id has its own watermark
    other = DeltaConfig(enabled=True, path=str(tmp_path / "other"))
    assert write_delta(_batch(range(1, 2), "r9"), other, app_id="x", version=1)

    table = deltalake.DeltaTable(cfg.path)
    assert table.transaction_version("app") == 2
    assert table.metadata().partition_columns == ["day"]
    assert table.version() == 1, "two commits (0, 1); the replays committed nothing"
    df = table.to_pandas().sort_values("review_id")
    assert list(df.review_id) == list(range(1, 11)), "each review once"
    assert list(df.columns) == [*RESULT_COLUMNS, "run_id", "day"]
    days = dict(zip(df.review_id, df.day, strict=True))
    assert days[1] == date(2026, 11, 2) and days[2] == date(2026, 11, 3), "day of created_at, in UTC"
    assert days[3] == date(2026, 11, 30), "NULL created_at: the day it was analysed"
    folders = sorted(p.name for p in Path(cfg.path).iterdir() if p.name.startswith("day="))
    assert folders == ["day=2026-11-01", "day=2026-11-02", "day=2026-11-03", "day=2026-11-30"]


def test_rows_keep_types_and_instants() -> None:
    rows = to_delta_rows(_batch(range(1, 3), "r1"))
    assert str(rows.schema.field("review_created_at").type) == "timestamp[us, tz=UTC]"
    assert rows["review_created_at"][0].as_py().replace(tzinfo=None) == datetime(2026, 11, 2, 23, 30)
    assert not rows.schema.field("review_id").nullable and rows.schema.field("error").nullable
    with pytest.raises(ValueError, match="run_id"):
        to_delta_rows(_batch(range(1, 3), "r1").drop(columns=["run_id"]))


def test_importing_qwenspark_does_not_import_deltalake() -> None:
    code = "import sys, qwenspark, qwenspark.pipeline, qwenspark.io.delta; print('deltalake' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
