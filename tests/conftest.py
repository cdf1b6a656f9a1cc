"""Shared fixtures: the real dev data, a throwaway MariaDB, local Spark, the tiny and default models."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEV_CSV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"
CACHE = Path(os.environ.get("QWENSPARK_CACHE", ROOT / ".cache"))


def _free_port() -> int:
    # A port of our own: two test runs on one machine (or a developer's demo DB) must not collide.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DB_PORT = _free_port()

# Short reviews, zh and en, for the engine tests.
SAMPLE_REVIEWS = [
    ("房间干净，服务热情，下次还来。", "zh"),
    ("the pool was closed and nobody told us. breakfast ok", "en"),
    ("隔音太差了，一晚上没睡好😡", "zh"),
    ("Great value for money, tiny bathroom though.", "en"),
    ("一般般吧", "zh"),
    ("Staff were rude at check-in but the room was spotless and quiet.", "en"),
]

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Spark's Python workers import engine factories of the tests (tests.support.echo_engine): put the repo root on
# their path. Workers inherit the driver JVM's environment, which is taken from this process at Spark's start.
if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
# The services the tests start publish their answers in flight on a board of this run's own, not on the host's
# (/dev/shm/qwenspark-services), where a user's batch beside them would give way to a test (engine.yield_to_service).
os.environ.setdefault("QWENSPARK_SERVICE_BOARD", tempfile.mkdtemp(prefix="qwenspark-board-"))


@pytest.fixture(scope="session")
def dev_reviews() -> pd.DataFrame:
    """The 7,500 real labelled reviews (read at run time from ../shared, never committed)."""
    if not DEV_CSV.exists():
        pytest.fail(f"{DEV_CSV} is missing: the tests need ../shared beside the clone")
    return pd.read_csv(DEV_CSV, dtype=str, keep_default_na=False)


@pytest.fixture(scope="session")
def mariadb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A MariaDB server for this test session only, on a free 127.0.0.1 port; stopped at the end.

    Its accounts are the demo's (scripts/mariadb.sh): password_file is the least-privilege job account's
    (`qwenspark`, DML only: tests connect as it), admin_password_file the schema owner's (`qwenspark_admin`:
    migrations, grants, writing hotel_reviews, test tables), dashboard_password_file the views' reader's.
    """
    if shutil.which("mariadbd") is None:
        pytest.fail("mariadbd is not installed: run `make deps`")
    folder = tmp_path_factory.mktemp("mariadb")
    env = {**os.environ, "MARIADB_DIR": str(folder), "MARIADB_PORT": str(DB_PORT)}
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "start"], check=True, env=env)
    server: dict[str, object] = {
        "port": DB_PORT,
        "password_file": folder / "qwenspark.password",
        "admin_password_file": folder / "qwenspark-admin.password",
        "dashboard_password_file": folder / "qwenspark-dashboard.password",
        "socket": folder / "mysqld.sock",
        "dir": folder,
    }
    try:
        # As `make demo` does: schema and the roles' grants by init-db (as the owner), before any job runs.
        sets = [f"--set=db.port={DB_PORT}", f"--set=db.admin_password_file={server['admin_password_file']}",
                f"--set=db.password_file={server['password_file']}", "--set=db.admin_password_env=QS_NO_SUCH_VAR"]
        subprocess.run([sys.executable, "-m", "qwenspark.cli", "-q", "init-db", "--config",
                        str(ROOT / "conf" / "local.yaml"), *sets], check=True, cwd=ROOT, timeout=120)
        yield server
    finally:
        subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "stop"], check=False, env=env)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A tiny random Qwen3 with the real Qwen tokenizer, built once per cache."""
    from tests.support.tiny_model import build_tiny_qwen

    return build_tiny_qwen(CACHE / "test-models" / "tiny-qwen3")


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local Spark session for the whole run (starting one costs ~5-10 s)."""
    from pyspark.sql import SparkSession

    from qwenspark.session import BASE_CONF

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("qwenspark-tests")
        .config("spark.jars", "/usr/share/java/mariadb-java-client.jar")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in BASE_CONF.items():
        builder = builder.config(key, value)
    builder = builder.config(
        "spark.driver.extraJavaOptions", "-Duser.timezone=UTC -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    )
    session = builder.getOrCreate()
    yield session
    session.stop()
