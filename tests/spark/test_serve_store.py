"""serve.store: reviews the service answered are committed as a run of their own (ledger row, aggregates) with the
batch's input_key, and a later batch run skips them: the engine's own records show it never saw them again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark.analyze import templated
from qwenspark.config import QwenSparkConfig
from qwenspark.engines import build_engine
from qwenspark.pipeline import run_batch
from qwenspark.serve.app import Service, create_app
from qwenspark.serve.engine import Threaded
from qwenspark.serve.store import Store
from tests.spark.conftest import assert_consistent, echo_records, load_reviews, query, recording, reset_tables

pytestmark = pytest.mark.spark

REVIEWS = pd.DataFrame({
    "review_id": [1, 2, 3, 9_223_372_036_854_775_807],
    "hotel_id": ["H1", "H1", "H2", "H2"],
    "created_at": ["2026-11-01 10:00:00", "2026-11-02 23:59:59", "2026-11-02 08:00:00", "9999-12-31 23:59:59"],
    "lang": ["en", "zh", "en", "EN"],
    "rating": ["", "", "", ""],
    "text": ["Rude staff, dirty room.", "房间很干净，服务热情。", "Quiet room, fine breakfast.", "Lovely view."],
})
SERVED = (0, 1, 3)  # rows the service answers first (the BIGINT-max id and the 9999 date among them)


def test_served_reviews_are_committed_with_the_aggregates_and_the_batch_skips_them(
    spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path
) -> None:
    cfg = recording(echo_cfg, tmp_path / "echo")
    cfg = cfg.model_copy(update={"serve": cfg.serve.model_copy(update={"store": True}),
                                 "prompt": cfg.prompt.model_copy(update={"version": "v10"})})
    reset_tables(cfg)
    load_reviews(cfg, REVIEWS, tmp_path)

    async def serve_some() -> list[httpx.Response]:
        engine = Threaded(build_engine(templated(cfg.engine, cfg.prompt.version)), concurrent=False)
        store = Store(cfg)
        await store.start()
        service = Service(cfg, engine, store=store.put)
        app = create_app(service)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            answers = [await client.post("/v1/analyze", json={
                "text": REVIEWS.text[i], "lang": REVIEWS.lang[i], "hotel_id": REVIEWS.hotel_id[i],
                "review_id": int(REVIEWS.review_id[i]), "created_at": REVIEWS.created_at[i].replace(" ", "T"),
            }) for i in SERVED]
            refused = await client.post("/v1/analyze", json={"text": "no id"})
        await store.stop()
        assert refused.status_code == 400 and "review_id" in refused.json()["error"]
        assert [run.rows_changed for run in store.runs] == [3]
        return answers

    answers = asyncio.run(serve_some())
    assert [a.status_code for a in answers] == [200, 200, 200]
    stored = query(cfg, "SELECT review_id, sentiment, input_key, review_created_at FROM review_sentiment "
                        "ORDER BY review_id")
    served_ids = [int(REVIEWS.review_id[i]) for i in SERVED]
    assert [r[0] for r in stored] == served_ids
    assert {r[0]: r[2] for r in stored} == {a.json()["results"][0]["review_id"]: a.json()["results"][0]["input_key"]
                                            for a in answers}
    assert str(stored[-1][3]) == "9999-12-31 23:59:59"
    assert query(cfg, "SELECT job, status, rows_analysed, rows_changed FROM job_runs") == [("serve", "succeeded", 3, 3)]
    assert_consistent(cfg)  # the aggregates moved with the rows

    served_calls = len(echo_records(tmp_path / "echo"))
    summary = run_batch(spark, cfg)
    assert (summary.rows_selected, summary.rows_skipped, summary.rows_analysed) == (4, 3, 1)
    batch_calls = echo_records(tmp_path / "echo")[served_calls:]
    assert sum(call["rows"] for call in batch_calls) == 1, "the batch's engine saw only the review not served"
    assert [r[0] for r in query(cfg, "SELECT review_id FROM review_sentiment ORDER BY review_id")] == [1, 2, 3,
                                                                                                       served_ids[-1]]
    assert_consistent(cfg)
