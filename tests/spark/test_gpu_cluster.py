"""A real standalone cluster with two fake GPUs: one engine per executor, each on its own GPU address."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

pytestmark = [pytest.mark.spark, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
DRIVER = Path(__file__).resolve().parent / "gpu_cluster_driver.py"
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
ROWS, PARTITIONS, BATCH = 48, 8, 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 20) -> None:
    """TERM the process group (the daemon, its executors and their Python workers), then KILL what is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    # Executors or Python workers the daemon did not take down are still in its group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def start_daemon(
    args: list[str], log: Path, env: dict[str, str], ready: str, timeout_s: float = 90
) -> subprocess.Popen[bytes]:
    """spark-class CLASS ARGS in its own process group; returns once `ready` appears in its log."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready in log.read_text(errors="replace"):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    stop_group(proc)
    pytest.fail(f"{args[0]} not ready after {timeout_s:.0f} s (exit {proc.returncode}):\n{tail(log)}")


@pytest.fixture
def standalone_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Master + one Worker (2 cores, 6g, GPUs "0" and "1" from the discovery script); stopped at teardown."""
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(tmp_path / "local"),
        "SPARK_DAEMON_JAVA_OPTS": FAST_JVM,
    }
    master_conf = tmp_path / "master.conf"
    # The REST submission server would take the fixed port 6066: not needed.
    master_conf.write_text("spark.master.rest.enabled false\n")
    worker_conf = tmp_path / "worker.conf"
    worker_conf.write_text(
        "spark.worker.resource.gpu.amount 2\n"
        f"spark.worker.resource.gpu.discoveryScript {ROOT / 'conf' / 'getGpusResources.sh'}\n"
    )
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        daemons.append(
            start_daemon(
                ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(free_port()), "--properties-file", str(master_conf)],
                tmp_path / "master.log", env, "I have been elected leader",
            )
        )
        daemons.append(
            start_daemon(
                ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--webui-port", str(free_port()), "--cores", "2", "--memory", "6g",
                 "--work-dir", str(tmp_path / "work"), "--properties-file", str(worker_conf)],
                tmp_path / "worker.log", {**env, "QWENSPARK_FAKE_GPUS": "0,1"}, "Successfully registered with master",
            )
        )
        yield url, tmp_path
    finally:
        for proc in reversed(daemons):  # the worker first: it stops its executors
            stop_group(proc)


def test_one_engine_per_executor_each_on_its_own_gpu(
    standalone_cluster: tuple[str, Path], tiny_model: Path
) -> None:
    url, logs = standalone_cluster
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    driver_log = logs / "driver.log"
    cmd = [sys.executable, str(DRIVER), "--master", url, "--model", str(tiny_model), "--rows", str(ROWS),
           "--partitions", str(PARTITIONS), "--batch-size", str(BATCH)]
    with driver_log.open("wb") as err:
        # A separate driver process: this test session's JVM already holds the local SparkContext.
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s=5)
            stdout = b""
    executor_logs = sorted((logs / "work").glob("app-*/*/stderr"))
    context = "\n".join(
        [f"--- driver (exit {proc.returncode}) ---", tail(driver_log)]
        + [f"--- {p.relative_to(logs)} ---\n{tail(p, 15)}" for p in executor_logs]
    )
    (logs / "driver.out").write_bytes(stdout)
    lines = [line for line in stdout.decode(errors="replace").splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, context
    result = json.loads(lines[-1])

    assert result["rows"] == ROWS and result["review_ids"] == list(range(ROWS)), "one row out per row in"
    assert result["metric_rows"] == ROWS
    assert result["tasks"] == list(range(PARTITIONS)), "every one of the 8 tasks produced rows"
    batches = sum(result["batch_sizes"].values())
    assert batches >= ROWS // BATCH, result["batch_sizes"]

    # Two executors (two Python workers), each bound to a distinct GPU address ("pid:addresses" keys).
    bindings = dict(key.split(":", 1) for key in result["gpu_bindings"])
    assert len(bindings) == 2, result["gpu_bindings"]
    assert set(bindings.values()) == {"0", "1"}, result["gpu_bindings"]
    # One engine load per executor, however many tasks and batches ran.
    assert set(result["engine_loads"]) == set(bindings), result
    assert list(result["engine_loads"].values()) == [1, 1], result["engine_loads"]
    assert len(executor_logs) == 2, context
