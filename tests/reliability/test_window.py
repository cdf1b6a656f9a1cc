"""The created_at window selects the same reviews whatever the driver's time zone (issue 9, finding 2)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark.config import QwenSparkConfig
from qwenspark.io import jdbc
from qwenspark.pipeline import run_batch
from tests.spark.conftest import load_reviews, query, reset_tables

pytestmark = pytest.mark.spark

# review_id -> created_at (UTC). The window is 2026-11-01 00:00 (incl.) .. 2026-11-02 00:00 (excl.) UTC.
CREATED = {
    1: "2026-10-31 23:59:59",
    2: "2026-11-01 00:00:00",
    3: "2026-11-01 07:59:59",
    4: "2026-11-01 08:00:00",
    5: "2026-11-01 15:59:59",
    6: "2026-11-01 16:00:00",  # the hours a UTC+8 driver lost: 16:00-24:00 UTC
    7: "2026-11-01 23:59:59",
    8: "2026-11-02 00:00:00",
    9: "2026-11-02 07:59:59",
}
INSIDE = [2, 3, 4, 5, 6, 7]


@pytest.fixture
def driver_zone(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test process (the Spark driver's Python side) runs in request.param's zone, then back."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    try:
        yield request.param
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.mark.parametrize("driver_zone", ["Asia/Shanghai", "America/Los_Angeles"], indirect=True)
@pytest.mark.parametrize(
    "bounds",
    [("2026-11-01", "2026-11-02"), ("2026-11-01T08:00:00+08:00", "2026-11-01T16:00:00-08:00")],
    ids=["naive-utc", "offsets"],
)
def test_window_is_exact_in_any_driver_zone(
    spark: SparkSession, echo_cfg: QwenSparkConfig, tmp_path: Path, driver_zone: str, bounds: tuple[str, str]
) -> None:
    assert time.localtime(0).tm_gmtoff != 0, "the test must run the driver outside UTC"
    src = type(echo_cfg.source).model_validate(
        {**echo_cfg.source.model_dump(), "created_from": bounds[0], "created_until": bounds[1]}
    )
    cfg = echo_cfg.model_copy(update={"source": src})
    reset_tables(cfg)
    reviews = pd.DataFrame(
        {
            "review_id": list(CREATED),
            "hotel_id": "H1",
            "created_at": list(CREATED.values()),
            "lang": "en",
            "rating": "",
            "text": [f"clean room number {i}" for i in CREATED],
        }
    )
    load_reviews(cfg, reviews, tmp_path)
    assert jdbc.id_bounds(cfg) == (min(INSIDE), max(INSIDE), len(INSIDE))

    summary = run_batch(spark, cfg)

    stored = [r[0] for r in query(cfg, "SELECT review_id FROM review_sentiment ORDER BY review_id")]
    assert stored == INSIDE, f"driver in {driver_zone}: analysed {stored}, the window holds {INSIDE}"
    assert (summary.rows_selected, summary.rows_skipped, summary.rows_analysed) == (len(INSIDE), 0, len(INSIDE))
    again = run_batch(spark, cfg)
    assert (again.rows_selected, again.rows_skipped, again.rows_analysed) == (len(INSIDE), len(INSIDE), 0)
