"""A real Spark standalone cluster (Master + one Worker offering fake GPUs), started with pyspark's spark-class.

Shared by tests/spark/test_gpu_cluster.py and bench/slot_scaling.py. pyspark's pip package has no sbin/ scripts,
but bin/spark-class starts the daemons; the Worker advertises GPUs "0".."N-1" through conf/getGpusResources.sh
with QWENSPARK_FAKE_GPUS in its environment. Every daemon runs in its own process group, so stopping the group
also takes down the executors and Python workers it started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class DaemonError(RuntimeError):
    """A Spark daemon did not come up (the message holds the end of its log)."""


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
    raise DaemonError(f"{args[0]} not ready after {timeout_s:.0f} s (exit {proc.returncode}):\n{tail(log)}")


@contextlib.contextmanager
def standalone_cluster(folder: Path, gpus: int, cores: int, memory: str = "8g") -> Iterator[str]:
    """Master + one Worker offering `cores` cores and fake GPUs "0".."gpus-1"; yields the spark:// URL.

    Logs (master.log, worker.log), the Worker's work dir and SPARK_LOCAL_DIRS go under folder. On exit the Worker
    is stopped first (it stops its executors), then the Master.
    """
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(folder / "local"),
        "SPARK_DAEMON_JAVA_OPTS": FAST_JVM,
    }
    master_conf = folder / "master.conf"
    # The REST submission server would take the fixed port 6066: not needed.
    master_conf.write_text("spark.master.rest.enabled false\n")
    worker_conf = folder / "worker.conf"
    worker_conf.write_text(
        f"spark.worker.resource.gpu.amount {gpus}\n"
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
                folder / "master.log", env, "I have been elected leader",
            )
        )
        fake = ",".join(str(i) for i in range(gpus))
        daemons.append(
            start_daemon(
                ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                 "--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory,
                 "--work-dir", str(folder / "work"), "--properties-file", str(worker_conf)],
                folder / "worker.log", {**env, "QWENSPARK_FAKE_GPUS": fake}, "Successfully registered with master",
            )
        )
        yield url
    finally:
        for proc in reversed(daemons):  # the worker first: it stops its executors
            stop_group(proc)
