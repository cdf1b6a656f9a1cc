"""The CLI's failures: one `qwenspark: error:` line naming the setting, exit 2 for config and 1 for runtime, no
traceback; these are caught before Spark starts (the database cases: tests/reliability/test_errors.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mysql.connector
import pytest

from qwenspark.cli import EXIT_CONFIG, EXIT_RUNTIME, fail
from qwenspark.config import DbConfig, load_config
from qwenspark.errors import ConfigError, DatabaseError, as_qwenspark_error, db_error

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "conf" / "local.yaml"
JAR = Path("/usr/share/java/mariadb-java-client.jar")


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "pw"
    path.write_text("not-the-password\n")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "QWENSPARK_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "qwenspark.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def batch(password_file: Path, *overrides: str, command: str = "batch") -> subprocess.CompletedProcess[str]:
    sets = [f"db.password_file={password_file}", "db.password_env=QS_TEST_NO_SUCH_VAR", "db.port=1", *overrides]
    return run_cli(command, "--config", str(LOCAL), *(f"--set={s}" for s in sets))


def error_line(out: subprocess.CompletedProcess[str], code: int) -> str:
    """The one error line, after checking the exit code and that no traceback was printed."""
    lines = [line for line in out.stderr.splitlines() if line.startswith("qwenspark: error:")]
    assert out.returncode == code, out.stderr[-3000:]
    assert len(lines) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return lines[0]


def test_missing_jdbc_jar(password_file: Path) -> None:
    # It used to pass the driver-side guard and end in ClassNotFoundException inside Spark.
    line = error_line(batch(password_file, "db.jdbc_jar=/nonexistent/mariadb-java-client.jar"), EXIT_CONFIG)
    assert line.startswith("qwenspark: error: db.jdbc_jar: /nonexistent/mariadb-java-client.jar does not exist")


def test_jdbc_jar_that_is_not_a_jar(password_file: Path) -> None:
    line = error_line(batch(password_file, f"db.jdbc_jar={password_file}", command="stream"), EXIT_CONFIG)
    assert f"db.jdbc_jar: {password_file} is not a readable jar" in line


def test_jdbc_jar_without_the_driver_class(password_file: Path) -> None:
    line = error_line(batch(password_file, f"db.jdbc_jar={JAR}", "db.jdbc_driver=org.example.Driver"), EXIT_CONFIG)
    assert f"db.jdbc_jar: {JAR} has no class org.example.Driver (db.jdbc_driver)" in line


def test_empty_password_file(password_file: Path) -> None:
    password_file.write_text("")  # it said "list index out of range"
    line = error_line(batch(password_file), EXIT_CONFIG)
    assert f"db.password_file: {password_file} is empty: its first line must be the password" in line


def test_unreadable_password_file(password_file: Path) -> None:
    password_file.unlink()
    line = error_line(batch(password_file), EXIT_CONFIG)
    assert f"db.password_file: {password_file} cannot be read: No such file or directory" in line


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("prompt.version=v99", "prompt.version: unknown 'v99'"),  # it failed only inside the first Spark task
        ("engine.model=.cache/models/my-model", "engine: default_model: true"),  # it ran the default model
        ("engine.batch_size=true", "engine.batch_size: expected a number, got true"),  # it ran batches of one
    ],
)
def test_config_rules_fail_before_spark(password_file: Path, override: str, named: str) -> None:
    assert named in error_line(batch(password_file, override), EXIT_CONFIG)


def test_runtime_failure_exits_1(tmp_path: Path, password_file: Path) -> None:
    # Not a setting: a rerun with the file in place works. Every QwenSparkError exited 2 before.
    missing = tmp_path / "labelled.csv"
    out = run_cli("eval", "--config", str(LOCAL), "--input", str(missing), f"--set=db.password_file={password_file}")
    assert f"eval: cannot read {missing}" in error_line(out, EXIT_RUNTIME)


@pytest.mark.parametrize("flag", ["--out", "--rows-out"])
def test_eval_output_in_a_missing_folder_fails_before_the_run(tmp_path: Path, flag: str) -> None:
    # Written after the whole run (minutes of model time): a typo in the folder is found first.
    csv = tmp_path / "labelled.csv"
    csv.write_text("source_id,lang,text,rating,label\na,en,Nice.,5,positive\n")
    out = run_cli("eval", "--config", str(LOCAL), "--input", str(csv), flag, str(tmp_path / "no" / "r.json"))
    assert f"eval: {flag} {tmp_path / 'no' / 'r.json'}: folder {tmp_path / 'no'} does not exist" in error_line(
        out, EXIT_CONFIG)


def test_debug_shows_the_traceback(password_file: Path) -> None:
    out = run_cli("--debug", "batch", "--config", str(LOCAL), "--set=db.jdbc_jar=/nonexistent/x.jar",
                  f"--set=db.password_file={password_file}")
    assert out.returncode == EXIT_CONFIG
    assert "Traceback" in out.stderr and out.stderr.count("qwenspark: error:") == 1


def _db_cfg(password_file: Path) -> DbConfig:
    return load_config(LOCAL, [f"db.password_file={password_file}", "db.password_env=QS_TEST_NO_SUCH_VAR"]).db


@pytest.mark.parametrize(
    ("errno", "kind", "named"),
    [
        (2003, DatabaseError, "cannot connect to the database at 127.0.0.1:13306 (db.host, db.port)"),
        (2013, DatabaseError, "lost the connection to the database at 127.0.0.1:13306"),
        (1045, ConfigError, "refused the login of user 'qwenspark' (db.user) with the password from db.password_file"),
        (1049, ConfigError, "database 'qwenspark' (db.database) does not exist"),
        (1142, ConfigError, "user 'qwenspark' (db.user) lacks a privilege the job needs: denied"),
        (1213, DatabaseError, "database error 1213 at 127.0.0.1:13306"),
    ],
)
def test_mysql_errors_map_to_one_kind_and_line(
    password_file: Path, errno: int, kind: type[Exception], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    exc = mysql.connector.errors.DatabaseError(msg="denied\nsecond line", errno=errno)
    db = _db_cfg(password_file)
    error = as_qwenspark_error(exc, db)
    assert type(error) is kind and named in str(error)
    assert "not-the-password" not in str(error)
    assert fail(RuntimeError("wrapped"), db) == EXIT_RUNTIME  # no cause: a runtime error of its own
    try:
        raise RuntimeError("during the commit") from exc
    except RuntimeError as wrapped:  # a database error behind another one decides the kind
        code = fail(wrapped, db)
    assert code == (EXIT_CONFIG if kind is ConfigError else EXIT_RUNTIME)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1].startswith("qwenspark: error: ") and "denied second line" in lines[1]


def test_unexpected_error_is_one_runtime_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert fail(ValueError("bad\n  value")) == EXIT_RUNTIME
    assert capsys.readouterr().err == "qwenspark: error: unexpected error: ValueError: bad value\n"


class _JavaTrace(Exception):
    """The text of a Py4JJavaError whose Java objects cannot be read any more (the JVM has stopped)."""

    java_exception = None


def test_java_stack_trace_text_gives_the_root_sql_cause(password_file: Path) -> None:
    trace = (
        "An error occurred while calling o88.count.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n"
        "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)\n"
        "Caused by: java.sql.SQLNonTransientConnectionException: (conn=12) Connection reset\n"
        "\tat org.mariadb.jdbc.internal.util.exceptions.ExceptionFactory.createException(ExceptionFactory.java:73)\n"
    )
    error = as_qwenspark_error(_JavaTrace(trace), _db_cfg(password_file))
    assert isinstance(error, DatabaseError)
    assert str(error) == (
        "the connection to the database at 127.0.0.1:13306 (db.host, db.port) failed: (conn=12) Connection reset"
    )


def test_no_error_number_falls_back_to_the_sql_state(password_file: Path) -> None:
    # Connector/J reports a refused connection as error code -1, SQLState 08000; mysql.connector uses -1 too.
    db = _db_cfg(password_file)
    refused = mysql.connector.errors.InterfaceError(msg="Connection refused", sqlstate="08000")
    assert str(as_qwenspark_error(refused, db)) == (
        "the connection to the database at 127.0.0.1:13306 (db.host, db.port) failed: Connection refused"
    )
    assert isinstance(db_error(-1, "Access denied", db, "28000"), ConfigError)
    assert str(db_error(0, "odd", db)) == "database error at 127.0.0.1:13306 (db.host, db.port): odd"
