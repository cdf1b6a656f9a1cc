"""Database failures a user can act on: wrong password, server down, missing grants; each one `qwenspark: error:`
line naming the setting, exit 2 (config) or 1 (runtime), before Spark starts (issue 9, finding 6)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from qwenspark import preflight
from qwenspark.cli import EXIT_CONFIG, EXIT_RUNTIME
from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.io import migrate
from tests.reliability.dbserver import DbServer, free_port
from tests.spark.conftest import load_reviews, reset_tables

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "conf" / "local.yaml"
# Accounts of this module on the session server, dropped at its end.
RO_USER, BARE_USER, ROLE_USER, ROLE = "qs_t9_ro", "qs_t9_bare", "qs_t9_role", "qs_t9_writer"
BARE_DB = "qs_t9_bare"
PASSWORD = "Pw-t9-7f3a"  # of the accounts above; must never appear in an error line
JOB_GRANTS = "SELECT, INSERT, UPDATE, DELETE, CREATE TEMPORARY TABLES"


def root_sql(mariadb: dict[str, object], sql: str) -> None:
    """Run sql as root through the server's socket (what an operator granting privileges does)."""
    subprocess.run(
        ["mariadb", "--no-defaults", f"--socket={mariadb['socket']}", "-uroot", "-e", sql],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def accounts(mariadb: dict[str, object]) -> Iterator[None]:
    """A SELECT-only user; a user without CREATE on an empty database; a user with the job's grants via a role."""
    root_sql(
        mariadb,
        f"""
        CREATE DATABASE IF NOT EXISTS {BARE_DB};
        CREATE USER IF NOT EXISTS '{RO_USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}';
        GRANT SELECT ON qwenspark.* TO '{RO_USER}'@'127.0.0.1';
        CREATE USER IF NOT EXISTS '{BARE_USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}';
        GRANT {JOB_GRANTS} ON {BARE_DB}.* TO '{BARE_USER}'@'127.0.0.1';
        CREATE ROLE IF NOT EXISTS {ROLE};
        GRANT {JOB_GRANTS} ON qwenspark.* TO {ROLE};
        CREATE USER IF NOT EXISTS '{ROLE_USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}';
        GRANT {ROLE} TO '{ROLE_USER}'@'127.0.0.1';
        SET DEFAULT ROLE {ROLE} FOR '{ROLE_USER}'@'127.0.0.1';
        """,
    )
    yield
    root_sql(
        mariadb,
        f"DROP USER IF EXISTS '{RO_USER}'@'127.0.0.1', '{BARE_USER}'@'127.0.0.1', '{ROLE_USER}'@'127.0.0.1';"
        f" DROP ROLE IF EXISTS {ROLE}; DROP DATABASE IF EXISTS {BARE_DB};",
    )


def db_sets(mariadb: dict[str, object], *overrides: str) -> list[str]:
    return [
        f"db.port={mariadb['port']}",
        f"db.password_file={mariadb['password_file']}",
        "db.password_env=QS_T9_NO_SUCH_VAR",
        f"db.admin_password_file={mariadb['admin_password_file']}",
        "db.admin_password_env=QS_T9_NO_SUCH_VAR",
        *overrides,
    ]


def cfg(mariadb: dict[str, object], *overrides: str) -> QwenSparkConfig:
    return load_config(LOCAL, db_sets(mariadb, *overrides))


def run_batch(
    sets: list[str], env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "qwenspark.cli", "batch", "--config", str(LOCAL), *(f"--set={s}" for s in sets)]
    return subprocess.run(
        args, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False
    )


def error_line(out: subprocess.CompletedProcess[str], code: int) -> str:
    """The one error line, after checking the exit code, that Spark never started and no traceback was printed."""
    lines = [line for line in out.stderr.splitlines() if line.startswith("qwenspark: error:")]
    assert out.returncode == code, out.stderr[-3000:]
    assert len(lines) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "SparkContext" not in out.stderr, out.stderr[-3000:]
    assert PASSWORD not in out.stderr + out.stdout
    return lines[0]


def test_wrong_password_from_the_file(mariadb: dict[str, object], tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text(f"{PASSWORD}\n")
    line = error_line(run_batch(db_sets(mariadb, f"db.password_file={wrong}")), EXIT_CONFIG)
    assert f"refused the login of user 'qwenspark' (db.user) with the password from db.password_file ({wrong})" in line


def test_wrong_password_from_the_environment(mariadb: dict[str, object]) -> None:
    out = run_batch(db_sets(mariadb, "db.password_env=QS_T9_PW"), env={"QS_T9_PW": PASSWORD})
    assert "with the password from $QS_T9_PW" in error_line(out, EXIT_CONFIG)


def test_database_down(mariadb: dict[str, object]) -> None:
    port = free_port()  # nothing listens there: a server that is down
    line = error_line(run_batch(db_sets(mariadb, f"db.port={port}")), EXIT_RUNTIME)
    assert f"cannot connect to the database at 127.0.0.1:{port} (db.host, db.port)" in line


def test_database_the_user_may_not_use(mariadb: dict[str, object]) -> None:
    line = error_line(run_batch(db_sets(mariadb, "db.database=qs_t9_nope")), EXIT_CONFIG)
    assert "'qs_t9_nope' (db.database)" in line


@pytest.mark.usefixtures("accounts")
def test_select_only_user_is_told_the_missing_grants(mariadb: dict[str, object]) -> None:
    migrate.migrate(cfg(mariadb).db)  # the tables exist: only the DML grants are missing
    out = run_batch(db_sets(mariadb, f"db.user={RO_USER}", "db.password_env=QS_T9_PW"), env={"QS_T9_PW": PASSWORD})
    line = error_line(out, EXIT_CONFIG)
    assert line.startswith(
        f"qwenspark: error: user '{RO_USER}' (db.user) lacks privileges the job needs: INSERT, UPDATE, DELETE on ")
    for table in ("review_sentiment", "review_sentiment_stage", "job_runs", "hotel_sentiment_daily"):
        assert f" {table}," in line or f" {table};" in line
    assert "CREATE TEMPORARY TABLES on qwenspark" in line
    assert "SELECT on" not in line  # it has SELECT
    grant = "GRANT INSERT, UPDATE, DELETE, CREATE TEMPORARY TABLES ON `qwenspark`.*"
    assert line.endswith(f"{grant} TO '{RO_USER}'@'127.0.0.1'")


@pytest.mark.usefixtures("accounts")
def test_missing_tables_need_init_db(mariadb: dict[str, object]) -> None:
    sets = db_sets(mariadb, f"db.user={BARE_USER}", f"db.database={BARE_DB}", "db.password_env=QS_T9_PW")
    line = error_line(run_batch(sets, env={"QS_T9_PW": PASSWORD}), EXIT_CONFIG)
    assert f"database {BARE_DB} on 127.0.0.1:" in line
    assert "has no qwenspark schema; this release needs version" in line
    assert "run `qwenspark init-db --config ...`" in line


@pytest.mark.usefixtures("accounts")
def test_the_jobs_grants_pass_through_a_role(mariadb: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    # The server decides (EXPLAIN), so grants held through a role count; information_schema would not show them.
    monkeypatch.setenv("QS_T9_PW", PASSWORD)
    owner = cfg(mariadb)
    migrate.migrate(owner.db)
    preflight.check(owner, "batch")
    preflight.check(cfg(mariadb, f"db.user={ROLE_USER}", "db.password_env=QS_T9_PW"), "batch")
    preflight.check(cfg(mariadb, f"db.user={ROLE_USER}", "db.password_env=QS_T9_PW"), "stream")


@pytest.fixture
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DbServer]:
    """A server of this test only: it gets killed in the middle of a run."""
    server = DbServer(tmp_path_factory.mktemp("lost-db"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.spark
def test_database_lost_during_the_read(own_server: DbServer, tmp_path: Path) -> None:
    """Killed while Spark reads the reviews over JDBC: the root SQLException of the Java failure, one line, exit 1."""
    echo = own_server.config()
    reset_tables(echo)
    reviews = pd.DataFrame({"review_id": range(1, 9), "hotel_id": "H1", "created_at": "2026-11-01 10:00:00",
                            "lang": "en", "rating": "", "text": [f"quiet room {i}" for i in range(8)]})
    load_reviews(echo, reviews, tmp_path)
    sets = [f"db.port={own_server.port}", f"db.password_file={own_server.password_file}",
            "db.password_env=QS_T9_NO_SUCH_VAR", "engine.kind=custom", "engine.factory=tests.support.echo_engine:build",
            "engine.model=echo", "engine.default_model=false"]
    env = {"QWENSPARK_FAILPOINT": "pipeline.read", "QWENSPARK_FAILPOINT_EXEC": own_server.kill_command()}
    out = run_batch(sets, env=env, timeout=480)  # Spark starts, and each read task is tried 4 times
    assert not own_server.alive(), "the failpoint never killed the server: the test proves nothing"
    lines = [line for line in out.stderr.splitlines() if line.startswith("qwenspark: error:")]
    assert out.returncode == EXIT_RUNTIME, out.stderr[-4000:]
    assert len(lines) == 1, out.stderr[-4000:]
    assert lines[0].startswith(
        f"qwenspark: error: the connection to the database at 127.0.0.1:{own_server.port} (db.host, db.port) failed: "
    ), lines[0]
