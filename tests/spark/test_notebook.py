"""notebooks/walkthrough.ipynb runs top to bottom (against the test MariaDB and the tiny model)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbclient import NotebookClient

from qwenspark.config import QwenSparkConfig
from tests.spark.conftest import ROOT, load_reviews, query, reset_tables, server_sets

pytestmark = [pytest.mark.spark, pytest.mark.engine]


def test_walkthrough_notebook_runs(
    tiny_cfg: QwenSparkConfig, mariadb: dict[str, object], tiny_model: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reset_tables(tiny_cfg)
    demo = pd.read_csv(ROOT / "data" / "demo" / "hotel_reviews_demo.csv", dtype=str, keep_default_na=False)
    load_reviews(tiny_cfg, demo.head(12), tmp_path)
    monkeypatch.setenv(
        "QWENSPARK_NOTEBOOK_SET",
        json.dumps([
            *server_sets(mariadb),  # the job's account, and the owner's that the notebook reads the views with
            f"engine.model={tiny_model}", "engine.default_model=false", "engine.max_tokens=384",
            "engine.env.VLLM_CPU_KVCACHE_SPACE=1",
        ]),
    )
    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", "python3"))
    nb = nbformat.read(ROOT / "notebooks" / "walkthrough.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    assert query(tiny_cfg, "SELECT COUNT(*) FROM review_sentiment")[0][0] == 12
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "succeeded" in outputs
    # Section 3: the API on a DataFrame of the notebook's own; its NULL comment kept, as an error.
    assert "booking_ref" in outputs and "r-3" in outputs and "empty: text is NULL" in outputs
