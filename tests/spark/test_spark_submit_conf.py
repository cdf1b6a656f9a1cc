"""spark-submit's settings win: --jars at another path, extra jars and the user's Java options are kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qwenspark.config import QwenSparkConfig
from tests.spark.conftest import reset_tables

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = Path(sys.executable).parent / "spark-submit"
JAR = Path("/usr/share/java/mariadb-java-client.jar")
EXTRA = next((p.resolve() for p in sorted(Path("/usr/share/java").glob("commons-cli*.jar"))), None)


def submit(args: list[str], cfg_args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run(
        [str(SUBMIT), "--master", "local[1]", *args, *cfg_args], cwd="/tmp", env=env, capture_output=True, text=True,
        timeout=240, check=False,
    )


def cfg_args(mariadb: dict[str, object]) -> list[str]:
    return [str(ROOT / "conf" / "local.yaml"), f"db.port={mariadb['port']}",
            f"db.password_file={mariadb['password_file']}", "db.password_env=QWENSPARK_TEST_NO_SUCH_VAR",
            # The job's own default jar path does not exist here: only spark-submit's --jars can make JDBC work.
            "db.jdbc_jar=/nonexistent/mariadb-java-client.jar"]


def test_submitted_jars_and_java_options_are_kept(
    tmp_path: Path, mariadb: dict[str, object], tiny_cfg: QwenSparkConfig
) -> None:
    reset_tables(tiny_cfg)
    moved = tmp_path / "drivers" / "mariadb-java-client.jar"
    moved.parent.mkdir()
    shutil.copy(JAR, moved)
    jars = [str(moved)] + ([str(EXTRA)] if EXTRA else [])
    done = submit(
        ["--jars", ",".join(jars), "--conf", "spark.executor.extraJavaOptions=-Dqwenspark.user=1",
         "--driver-memory", "1g", str(ROOT / "tests" / "spark" / "submit_conf_driver.py")],
        cfg_args(mariadb),
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1])
    conf = result["conf"]
    assert result["rows"] == 0  # the JDBC read worked through the jar at the non-default path
    listed = conf["spark.jars"].split(",")
    assert any(j.endswith(str(moved)) for j in listed), conf
    assert "/nonexistent/mariadb-java-client.jar" not in conf["spark.jars"]
    if EXTRA:
        assert any(j.endswith(EXTRA.name) for j in listed), listed
    # The user's executor option is kept and the job's time zone appended, not the other way round.
    assert "-Dqwenspark.user=1" in conf["spark.executor.extraJavaOptions"], conf
    assert "-Duser.timezone=UTC" in conf["spark.executor.extraJavaOptions"], conf
    assert conf["spark.driver.memory"] == "1g", conf  # --driver-memory beat local.yaml's spark.conf (2g)
    assert (conf["spark.sql.session.timeZone"], conf["spark.python.worker.reuse"]) == ("UTC", "true")


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("spark.sql.session.timeZone=Asia/Shanghai", "spark.sql.session.timeZone"),
        ("spark.executor.extraJavaOptions=-Duser.timezone=Asia/Shanghai", "spark.executor.extraJavaOptions"),
    ],
)
def test_a_setting_that_would_break_the_job_is_refused_by_name(
    mariadb: dict[str, object], setting: str, key: str
) -> None:
    done = submit(["--jars", str(JAR), "--conf", setting, str(ROOT / "jobs" / "hotel_sentiment.py"), "--config"],
                  [cfg_args(mariadb)[0], *[f"--set={a}" for a in cfg_args(mariadb)[1:]]])
    # spark-submit's PythonRunner merges the Python process's stderr into its stdout.
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"qwenspark: error: {key}" in done.stdout + done.stderr
