"""Issue 9 finding 5a: an openai-engine outage fails the batch run (nothing stored, nothing staged), and the next
run once the server is back analyses every review."""

from __future__ import annotations

import socket
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark.config import EngineConfig, QwenSparkConfig
from qwenspark.pipeline import run_batch
from tests.engine.test_openai_engine import Stub, stub  # noqa: F401  (stub: the fake server fixture)
from tests.spark.conftest import load_reviews, query, reset_tables

pytestmark = pytest.mark.spark

N = 10


def _reviews() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "review_id": range(1, N + 1),
            "hotel_id": [f"H{i % 2}" for i in range(N)],
            "created_at": [f"2026-11-0{1 + i % 3} 10:00:00" for i in range(N)],
            "lang": ["en" if i % 2 else "zh" for i in range(N)],
            "rating": [""] * N,
            "text": [f"Clean room number {i}, friendly staff." if i % 2 else f"房间{i}很干净。" for i in range(N)],
        }
    )


def _closed_port_url() -> str:
    with socket.socket() as sock:  # bound, never listening, closed: connecting is refused
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def _with_openai(cfg: QwenSparkConfig, base_url: str) -> QwenSparkConfig:
    # Small retries and timeout: the outage is under test, not the waiting.
    engine = EngineConfig(
        kind="openai",
        model="qwen-test",
        base_url=base_url,
        batch_size=4,
        max_concurrency=4,
        max_retries=1,
        request_timeout_s=5.0,
    )
    return cfg.model_copy(update={"engine": engine})


def test_server_down_fails_the_run_then_next_run_analyses_everything(
    spark: SparkSession,
    echo_cfg: QwenSparkConfig,
    stub: Stub,  # noqa: F811  (the imported fixture)
    tmp_path: Path,
) -> None:
    reset_tables(echo_cfg)
    load_reviews(echo_cfg, _reviews(), tmp_path)

    down = _with_openai(echo_cfg, _closed_port_url())
    with pytest.raises(Exception, match=r"openai engine: cannot reach engine\.base_url=http://127\.0\.0\.1:\d+/v1"):
        run_batch(spark, down)
    [(status, message)] = query(echo_cfg, "SELECT status, message FROM job_runs")
    assert status == "failed" and "cannot reach engine.base_url=" in str(message)
    assert query(echo_cfg, "SELECT COUNT(*) FROM review_sentiment")[0][0] == 0, "no error rows behind a failed run"
    assert query(echo_cfg, "SELECT COUNT(*) FROM review_sentiment_stage")[0][0] == 0

    back = run_batch(spark, _with_openai(echo_cfg, stub.url))
    assert (back.status, back.rows_selected, back.rows_analysed, back.rows_ok, back.rows_error) == (
        "succeeded", N, N, N, 0)  # fmt: skip
    rows = query(echo_cfg, "SELECT review_id, sentiment, summary, error FROM review_sentiment ORDER BY review_id")
    assert rows == [(i, "positive", "Clean room.", None) for i in range(1, N + 1)]
    assert len(stub.requests) == N, "each review sent once"
    assert [r[0] for r in query(echo_cfg, "SELECT status FROM job_runs ORDER BY started_at")] == ["failed", "succeeded"]
