"""The nightly DAG through real Airflow (`scripts/airflow-test.sh` -> `airflow dags test` -> SparkSubmitOperator
-> spark-submit jobs/hotel_sentiment.py) against the test MariaDB and the echo engine (tests/support/echo_engine.py:
the DAG's interval, the job's window on updated_at, the replay, edits and deletes are tested here, not the model).
spark-submit runs in .venv with the repo root on PYTHONPATH, inherited through Airflow, so that its Python workers
import the echo engine.

Airflow lives in its own venv (.venv-airflow, created by the script on first use: about 1-2 min); each DAG run
then costs about 30-40 s (Airflow start, spark-submit).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from qwenspark.config import QwenSparkConfig
from qwenspark.io import mysql
from tests.spark.conftest import echo_records, load_reviews, query, recording, reset_tables, snapshot

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        os.environ.get("QWENSPARK_SKIP_AIRFLOW") == "1",
        reason="QWENSPARK_SKIP_AIRFLOW=1: the Airflow DAG test is switched off (it installs .venv-airflow)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "airflow-test.sh"
DAG_ID = "qwenspark_hotel_sentiment_nightly"
# `airflow dags test DAG D` runs a *manual* run, whose inferred data interval is the day that ends at D:
# logical date 2026-11-03 -> [2026-11-02, 2026-11-03), the middle day of the data below, so that both
# bounds are tested. (A scheduled/backfill run with logical date 2026-11-02 covers the same day.)
LOGICAL_DATE = "2026-11-03"
DAY = "2026-11-02"
# Created-at times over three days; the ones on the interval's edges check that it is half-open.
TIMES = [
    "2026-11-01 08:00:00", "2026-11-01 15:30:00", "2026-11-01 23:00:00", "2026-11-01 23:59:59",
    "2026-11-02 00:00:00", "2026-11-02 09:15:00", "2026-11-02 18:40:00", "2026-11-02 23:59:59",
    "2026-11-03 00:00:00", "2026-11-03 07:00:00", "2026-11-03 12:00:00", "2026-11-03 21:30:00",
]  # fmt: skip


def _reviews(dev: pd.DataFrame) -> pd.DataFrame:
    """12 real dev reviews (zh and en alternating), four per day from 2026-11-01 to 2026-11-03."""
    zh, en = dev[dev.lang == "zh"].head(6), dev[dev.lang == "en"].head(6)
    texts, langs = [], []
    for z, e in zip(zh.text, en.text, strict=True):
        texts += [z, e]
        langs += ["zh", "en"]
    return pd.DataFrame(
        {
            "review_id": range(1, len(TIMES) + 1),
            "hotel_id": [f"H{i % 2}" for i in range(len(TIMES))],
            "created_at": TIMES,
            "lang": langs,
            "rating": [""] * len(TIMES),
            "text": texts,
        }
    )


def _execute(cfg: QwenSparkConfig, sql: str) -> None:
    """sql on hotel_reviews, as the application that owns it (the job's account may only read it)."""
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(sql)


def _write_config(cfg: QwenSparkConfig, path: Path) -> Path:
    """The test config as YAML for the job under spark-submit; the password stays in db.password_file."""
    assert cfg.db.password_file is not None, "the job must find the password in db.password_file"
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    assert cfg.db.password().get_secret_value() not in text
    path.write_text(text, encoding="utf-8")
    return path


def _run_dag(config: Path, airflow_home: Path, **settings: str) -> str:
    """scripts/airflow-test.sh for LOGICAL_DATE (settings: the DAG's QWENSPARK_* variables); its whole output
    (the task log included) on success."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "QWENSPARK_DB_PASSWORD"))}
    env.update(QWENSPARK_CONFIG=str(config), AIRFLOW_HOME=str(airflow_home), **settings)
    # The job's Python workers import tests.support.echo_engine: the repo root goes on their path. The task's
    # spark-submit inherits Airflow's environment (env_vars only add to it), and so do Spark's Python workers.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    # 15 min: enough for creating .venv-airflow on a first run plus one DAG run on a busy machine.
    done = subprocess.run(
        [str(SCRIPT), LOGICAL_DATE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"airflow-test.sh failed ({done.returncode}):\n{output[-6000:]}"
    return output


def test_nightly_dag_processes_its_day_once_replays_idempotently_then_catches_edits_and_deletes(
    echo_cfg: QwenSparkConfig, dev_reviews: pd.DataFrame, tmp_path: Path
) -> None:
    records = tmp_path / "echo"
    cfg = recording(echo_cfg, records)
    reset_tables(cfg)
    reviews = _reviews(dev_reviews)
    load_reviews(cfg, reviews, tmp_path)
    # The DAG windows on the change watermark: here each review was last written when it was created.
    _execute(cfg, "UPDATE hotel_reviews SET updated_at = created_at")
    config = _write_config(cfg, tmp_path / "airflow-test.yaml")
    # One Airflow home per test run: a fresh SQLite DB, so the dag_run rows below are this test's only.
    airflow_home = tmp_path / "airflow"
    expected = sorted(int(r) for r in reviews.review_id[reviews.created_at.str.startswith(DAY)])
    assert expected == [5, 6, 7, 8]

    output = _run_dag(config, airflow_home)
    password = cfg.db.password().get_secret_value()
    assert password not in output, "the DB password must never reach Airflow's logs or the spark-submit command"

    # Airflow's own record of the interval it handed to the job.
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        runs = db.execute(
            "SELECT state, data_interval_start, data_interval_end FROM dag_run WHERE dag_id = ?", (DAG_ID,)
        ).fetchall()
    assert len(runs) == 1 and runs[0][0] == "success", runs
    assert str(runs[0][1]).startswith("2026-11-02 00:00:00") and str(runs[0][2]).startswith("2026-11-03 00:00:00")

    ids = [r[0] for r in query(cfg, "SELECT review_id FROM review_sentiment ORDER BY review_id")]
    assert ids == expected, "only the reviews created in [11-02 00:00, 11-03 00:00), once each"
    # the engine of the spark-submit'ed job (its own record): the day's 4 reviews, nothing else
    assert sum(c["rows"] for c in echo_records(records)) == 4
    first = query(cfg, "SELECT status, rows_selected, rows_analysed, rows_changed FROM job_runs")
    assert [tuple(r) for r in first] == [("succeeded", 4, 4, 4)]
    days = query(cfg, "SELECT DISTINCT day FROM hotel_sentiment_daily")
    assert [str(d[0]) for d in days] == [DAY]

    before = snapshot(cfg)
    _run_dag(config, airflow_home)
    assert sum(c["rows"] for c in echo_records(records)) == 4, "the replayed day sent nothing to the engine"
    runs2 = query(
        cfg,
        "SELECT status, rows_selected, rows_analysed, rows_skipped, rows_changed FROM job_runs ORDER BY started_at",
    )
    assert len(runs2) == 2 and tuple(runs2[1]) == ("succeeded", 4, 0, 4, 0), runs2
    assert snapshot(cfg) == before, "the replayed day leaves the result tables identical"

    # During the day: review 6 edited (its new text analysed again), review 5 deleted (its result purged). Run
    # again with a 60-minute lookback: the window starts at 11-01 23:00, so reviews 3 and 4 (updated_at 23:00:00
    # and 23:59:59) come in too.
    _execute(cfg, "UPDATE hotel_reviews SET text = 'Dirty carpet, rude staff.', updated_at = '2026-11-02 20:00:00'"
                  " WHERE review_id = 6")
    _execute(cfg, "DELETE FROM hotel_reviews WHERE review_id = 5")
    _run_dag(config, airflow_home, QWENSPARK_WINDOW_LOOKBACK_MIN="60")
    ids = [r[0] for r in query(cfg, "SELECT review_id FROM review_sentiment ORDER BY review_id")]
    assert ids == [3, 4, 6, 7, 8]
    assert query(cfg, "SELECT sentiment, summary FROM review_sentiment WHERE review_id = 6") == [
        ("negative", "Dirty carpet, rude staff.")]
    assert sum(c["rows"] for c in echo_records(records)) == 4 + 3, "3, 4 and the edited 6 reached the engine"
    runs3 = query(cfg, "SELECT status, rows_selected, rows_analysed, rows_changed, rows_purged FROM job_runs"
                       " ORDER BY started_at")
    assert tuple(runs3[2]) == ("succeeded", 5, 3, 3, 1), runs3
    assert sum(int(r[0]) for r in query(cfg, "SELECT reviews FROM hotel_sentiment_daily")) == 5
