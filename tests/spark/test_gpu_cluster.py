"""A real standalone cluster with 4 executors of one fake GPU each: the whole batch run keeps 4 engines busy.

Proof from the echo engine's own records (tests/support/echo_engine.py writes them; the code under test does
not): 4 engines, each on a distinct GPU address and each analysing a share of the rows, 4 inference tasks at
once and never more, no address used by two engines at once, every review committed once, and a staging write
task that fails midway is retried without running the model again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.io import mysql
from tests.spark.conftest import as_owner, load_reviews, query, reset_tables, server_sets
from tests.support.echo_engine import max_overlap, read_records
from tests.support.standalone import SPARK_HOME, stop_group, tail
from tests.support.standalone import standalone_cluster as start_standalone

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "gpu_cluster_driver.py"
EXECUTORS, EXECUTOR_CORES, ROWS = 4, 2, 240


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Master + one Worker offering 8 cores and fake GPUs "0".."3" from the discovery script."""
    tmp_path = tmp_path_factory.mktemp("cluster")
    with start_standalone(tmp_path, gpus=EXECUTORS, cores=EXECUTORS * EXECUTOR_CORES) as url:
        yield url, tmp_path


def cluster_cfg(mariadb: dict[str, object], *overrides: str) -> QwenSparkConfig:
    return load_config(
        ROOT / "conf" / "local.yaml",
        [*server_sets(mariadb), "engine.kind=custom", "engine.model=echo",
         "engine.factory=tests.support.echo_engine:build", "engine.default_model=false", *overrides],
    )


def reviews(first_id: int, n: int) -> pd.DataFrame:
    start = datetime(2026, 11, 1)
    texts = ["Room {i} was spotless and the staff were kind.", "Breakfast was cold and the lift broken ({i}).",
             "房间{i}很干净，服务员态度很好。", "位置不错，但是隔音太差，晚上很吵。第{i}次住。"]
    return pd.DataFrame(
        [(i, f"H{i % 5}", (start + timedelta(hours=i % 200)).strftime("%Y-%m-%d %H:%M:%S"),
          "zh" if i % 4 >= 2 else "en", 1 + i % 5, texts[i % 4].format(i=i)) for i in range(first_id, first_id + n)],
        columns=["review_id", "hotel_id", "created_at", "lang", "rating", "text"],
    )


def run_driver(url: str, logs: Path, name: str, mariadb: dict[str, object], *extra: str) -> dict[str, object]:
    """Run gpu_cluster_driver.py against the cluster; its JSON summary (fails with the logs on error)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    records = logs / f"records-{name}"
    cmd = [sys.executable, str(DRIVER), "--master", url, "--executors", str(EXECUTORS),
           "--executor-cores", str(EXECUTOR_CORES), "--records", str(records),
           "--set", f"db.port={mariadb['port']}", "--set", f"db.password_file={mariadb['password_file']}",
           "--set", "db.password_env=QWENSPARK_TEST_NO_SUCH_VAR", "--set", "engine.batch_size=8",
           "--set", "engine.engine_kwargs.seconds_per_token=0.004", *extra]
    driver_log = logs / f"driver-{name}.log"
    with driver_log.open("wb") as err:
        # A separate driver process: this test session's JVM already holds the local SparkContext.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s=5)
            stdout = b""
    lines = [line for line in stdout.decode(errors="replace").splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"driver exit {proc.returncode}:\n{tail(driver_log, 60)}"
    return {**json.loads(lines[-1]), "records": records, "log": driver_log}


def test_four_gpu_slots_all_busy_through_the_whole_run(
    standalone_cluster: tuple[str, Path], mariadb: dict[str, object], tmp_path: Path
) -> None:
    url, logs = standalone_cluster
    cfg = cluster_cfg(mariadb)
    reset_tables(cfg)
    load_reviews(cfg, reviews(1, ROWS), tmp_path)

    result = run_driver(url, logs, "slots", mariadb)
    assert result["status"] == "succeeded" and result["rows_analysed"] == ROWS, result
    assert result["slots"] == EXECUTORS and result["partitions"] == EXECUTORS, result

    records = read_records(Path(str(result["records"])))
    loads = [r for r in records if r["event"] == "load"]
    calls = [r for r in records if r["event"] == "call"]
    # Four engines, one per executor, each on its own GPU address, each told the cores of its task.
    assert sorted(str(r["devices"]) for r in loads) == ["0", "1", "2", "3"], loads
    assert len({r["pid"] for r in loads}) == EXECUTORS, loads
    assert {r["threads"] for r in loads} == {str(EXECUTOR_CORES)}, loads
    # Every engine analysed a share, and the model saw each review exactly once (no re-run anywhere).
    rows_per_engine = Counter()
    for call in calls:
        rows_per_engine[call["pid"]] += int(call["rows"])
    assert len(rows_per_engine) == EXECUTORS and min(rows_per_engine.values()) >= ROWS // (4 * EXECUTORS), (
        rows_per_engine
    )
    assert sum(rows_per_engine.values()) == ROWS
    # Inference ran in 4 slots at once, never more (one task per GPU), and no address had two engines at once.
    assert max_overlap([(float(c["start"]), float(c["end"])) for c in calls]) == EXECUTORS
    by_device: dict[str, list[tuple[float, float]]] = {}
    for pid in {r["pid"] for r in loads}:
        mine = [(float(c["start"]), float(c["end"])) for c in calls if c["pid"] == pid]
        device = next(str(r["devices"]) for r in loads if r["pid"] == pid)
        by_device.setdefault(device, []).append((min(a for a, _ in mine), max(b for _, b in mine)))
    assert all(len(spans) == 1 for spans in by_device.values()), by_device
    # The result table is complete and reconciled.
    assert query(cfg, "SELECT COUNT(*), COUNT(DISTINCT review_id), SUM(error IS NULL) FROM review_sentiment")[0] == (
        ROWS, ROWS, ROWS
    )
    assert query(cfg, "SELECT COUNT(*) FROM review_sentiment_stage")[0][0] == 0


def test_a_staging_write_task_failing_midway_is_retried_without_rerunning_the_model(
    standalone_cluster: tuple[str, Path], mariadb: dict[str, object], tmp_path: Path
) -> None:
    url, logs = standalone_cluster
    cfg = cluster_cfg(mariadb)
    reset_tables(cfg)
    first, n = 5000, 160
    load_reviews(cfg, reviews(first, n), tmp_path)
    fail_id = first + n // 2
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        # A MyISAM counter is not rolled back with the failing statement: the trigger fires exactly once.
        cur.execute("DROP TRIGGER IF EXISTS test_fail_once")
        cur.execute("DROP TABLE IF EXISTS test_failctl")
        cur.execute("CREATE TABLE test_failctl (n INT NOT NULL) ENGINE=MyISAM")
        cur.execute("INSERT INTO test_failctl VALUES (1)")
        cur.execute(
            "CREATE TRIGGER test_fail_once BEFORE INSERT ON review_sentiment_stage FOR EACH ROW BEGIN "
            f"IF NEW.review_id = {fail_id} AND (SELECT n FROM test_failctl) > 0 THEN "
            "UPDATE test_failctl SET n = n - 1; "
            "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'test: the staging write fails once'; END IF; END"
        )
    try:
        # NONE: each JDBC batch commits, so the failed task leaves part of its rows staged before the retry.
        result = run_driver(url, logs, "retry", mariadb, "--set", "sink.isolation_level=NONE",
                            "--set", "sink.batchsize=10", "--set", "sink.write_partitions=2")
        failed_once = query(as_owner(cfg), "SELECT n FROM test_failctl")[0][0] == 0  # the job may not read it
    finally:
        with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("DROP TRIGGER IF EXISTS test_fail_once")
            cur.execute("DROP TABLE IF EXISTS test_failctl")
    assert failed_once, "the injected write failure never fired"
    assert "the staging write fails once" in Path(str(result["log"])).read_text(errors="replace")
    assert result["status"] == "succeeded" and result["rows_analysed"] == n, result
    calls = [r for r in read_records(Path(str(result["records"]))) if r["event"] == "call"]
    assert sum(int(c["rows"]) for c in calls) == n, "the retried write ran the model again"
    assert query(cfg, "SELECT COUNT(*), COUNT(DISTINCT review_id), MIN(review_id), MAX(review_id) "
                      "FROM review_sentiment")[0] == (n, n, first, first + n - 1)
    assert query(cfg, "SELECT status, rows_analysed FROM job_runs")[0] == ("succeeded", n)
