"""A Python worker lost in the middle of the analysis (killed like the OOM killer would) is retried, in local mode
too: the run succeeds and each review is stored once (issue 9, finding 5c)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from qwenspark.config import QwenSparkConfig
from qwenspark.session import with_local_retries
from tests.spark.conftest import ROOT, load_reviews, query, reset_tables

pytestmark = pytest.mark.spark


def test_local_masters_get_task_retries() -> None:
    assert with_local_retries("local[2]") == "local[2,4]"
    assert with_local_retries("local[*]", 3) == "local[*,3]"
    assert with_local_retries("local") == "local[1,4]"
    assert with_local_retries("local[2,7]") == "local[2,7]", "a user's own retry count stays"
    assert with_local_retries("spark://h:7077") == "spark://h:7077"


def test_killed_python_worker_is_retried(echo_cfg: QwenSparkConfig, tmp_path: Path) -> None:
    reset_tables(echo_cfg)
    n = 24
    reviews = pd.DataFrame(
        {
            "review_id": range(1, n + 1),
            "hotel_id": "H1",
            "created_at": "2026-11-01 10:00:00",
            "lang": "en",
            "rating": "",
            "text": [f"quiet room {i}, rude staff" if i % 2 else f"lovely stay {i}" for i in range(n)],
        }
    )
    load_reviews(echo_cfg, reviews, tmp_path)
    marker = tmp_path / "died"
    sets = [
        f"db.port={echo_cfg.db.port}",
        f"db.password_file={echo_cfg.db.password_file}",
        f"db.password_env={echo_cfg.db.password_env}",
        "engine.kind=custom",
        "engine.factory=tests.support.dying_engine:build",
        "engine.model=echo",
        "engine.default_model=false",
        "engine.batch_size=4",
        f"engine.engine_kwargs.die_marker={marker}",
        "spark.master=local[2]",
    ]
    args = [sys.executable, "-m", "qwenspark.cli", "batch", "--config", str(ROOT / "conf" / "local.yaml")]
    for item in sets:
        args += ["--set", item]
    done = subprocess.run(args, check=False, cwd=ROOT, env=os.environ, capture_output=True, text=True, timeout=300)
    assert marker.exists(), f"the engine worker was never killed: the test proves nothing\n{done.stderr[-3000:]}"
    assert done.returncode == 0, done.stderr[-3000:]
    rows = query(echo_cfg, "SELECT review_id, error FROM review_sentiment ORDER BY review_id")
    assert [r[0] for r in rows] == list(range(1, n + 1)) and all(r[1] is None for r in rows)
    assert query(echo_cfg, "SELECT status FROM job_runs") == [("succeeded",)]
    assert query(echo_cfg, "SELECT COUNT(*) FROM review_sentiment_stage") == [(0,)]
