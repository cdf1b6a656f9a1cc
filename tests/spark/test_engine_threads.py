"""The engine inside a Spark Python worker gets the cores of its slot, read back from the worker's runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from qwenspark.analyze import AnalyzeSpec, make_analyze_fn
from qwenspark.config import QwenSparkConfig
from qwenspark.engines.cache import PROBE_SCHEMA, probe_workers
from qwenspark.pipeline import analyse
from qwenspark.slots import plan_slots
from tests.conftest import SAMPLE_REVIEWS

pytestmark = [pytest.mark.spark, pytest.mark.engine]


def test_local_plan_is_one_engine_with_every_core(spark: SparkSession, tiny_cfg: QwenSparkConfig) -> None:
    cfg = tiny_cfg.model_copy(update={"job": tiny_cfg.job.model_copy(update={"repartition": None, "slots": None})})
    plan = plan_slots(spark, cfg)
    assert (plan.slots, plan.partitions, plan.cores_per_slot, plan.stage_level) == (1, 1, 2, False)


def test_vllm_engine_in_a_spark_worker_runs_on_the_slot_cores(
    spark: SparkSession, tiny_cfg: QwenSparkConfig, tmp_path: Path
) -> None:
    from datetime import datetime

    from qwenspark.clean import clean
    from qwenspark.schemas import INPUT_SCHEMA

    cfg = tiny_cfg.model_copy(update={"job": tiny_cfg.job.model_copy(update={"repartition": None, "slots": None})})
    rows = [(i, "H1", datetime(2026, 11, 1), lang, 5, text) for i, (text, lang) in enumerate(SAMPLE_REVIEWS)]
    out = analyse(clean(spark.createDataFrame(rows, INPUT_SCHEMA), cfg), cfg).collect()
    assert len(out) == len(rows)
    # Probe every Python worker (more tasks than workers); the one holding the engine reports its torch threads.
    probes = (
        spark.range(0, 8, numPartitions=8).mapInPandas(probe_workers, PROBE_SCHEMA).collect()  # type: ignore[arg-type]
    )
    with_engine = {p.pid: p.threads for p in probes if p.engines}
    assert with_engine, probes
    assert set(with_engine.values()) == {2}, with_engine


def test_threads_spec_reaches_the_engine_env(tiny_cfg: QwenSparkConfig) -> None:
    # The executor function sets OMP_NUM_THREADS in the engine's env (what the engine imports torch with).
    import pandas as pd

    seen = {}

    def factory(cfg):  # type: ignore[no-untyped-def]
        seen.update(cfg.env)
        raise RuntimeError("stop here")

    spec = AnalyzeSpec(engine=tiny_cfg.engine, prompt_version="v1", max_review_tokens=64, cores=3)
    fn = make_analyze_fn(spec, engine_factory=factory)
    frame = pd.DataFrame({"review_id": [1], "hotel_id": ["H"], "created_at": [pd.Timestamp("2026-11-01")],
                          "lang": ["en"], "text": ["ok"], "input_key": ["k"], "clean_error": [None]})
    with pytest.raises(RuntimeError, match="stop here"):
        list(fn(iter([frame])))
    assert seen["OMP_NUM_THREADS"] == "3"
