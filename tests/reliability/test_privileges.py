"""Least privilege on real MariaDB and Spark (issue 10, finding 4): the batch job and a stream micro-batch run under
the job account (`qwenspark`: DML only, through its role), which the server stops from changing the schema; the
dashboard account reads the views and nothing else; root has no TCP login, also on a folder of an older release;
a database of the release before schema versions goes through `qwenspark init-db` with nothing lost."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import mysql.connector
import pandas as pd
import pytest
from pyspark.sql import SparkSession

from qwenspark import preflight
from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.errors import DATABASE_DENIED, PRIVILEGE_DENIED, ConfigError
from qwenspark.io import grants, migrate
from qwenspark.io import mysql as db_sql
from qwenspark.pipeline import run_batch
from qwenspark.stream import run_stream
from tests.reliability.dbserver import DbServer, aggregate_mismatches
from tests.spark.conftest import ROOT, load_reviews, query, reset_tables, server_sets

pytestmark = pytest.mark.spark

LOCAL = ROOT / "conf" / "local.yaml"
SCRIPT = ROOT / "scripts" / "mariadb.sh"
OLD_DB = "qs_t10_upgrade"  # a database as the release before schema versions left it
# That release had the first four views of sql/views.sql; the dashboard's (v_dash_*) came later and read tables
# of later migrations, so they cannot be created on its tables.
OLD_VIEWS = [v for v in grants.views() if not v.startswith("v_dash_")]
BATCH_REVIEWS, STREAM_REVIEWS = 12, 5
TEXTS = ["Spotless room, kind staff.", "Noisy street and a cold breakfast.", "房间很干净，服务很好。",
         "隔音太差，晚上很吵。", "Great pool but a tiny bathroom."]


def _reviews(first: int, n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "review_id": range(first, first + n),
        "hotel_id": [f"H{i % 3}" for i in range(first, first + n)],
        "created_at": [f"2026-11-{1 + i % 4:02d} 10:00:00" for i in range(first, first + n)],
        "lang": ["zh" if i % 5 in (2, 3) else "en" for i in range(first, first + n)],
        "rating": [1 + i % 5 for i in range(first, first + n)],
        "text": [TEXTS[i % 5] for i in range(first, first + n)],
    })


def _cfg(mariadb: dict[str, object], *overrides: str) -> QwenSparkConfig:
    """conf/local.yaml on the session server with the echo engine: the job logs in as `qwenspark`."""
    return load_config(LOCAL, [
        *server_sets(mariadb), "engine.kind=custom", "engine.factory=tests.support.echo_engine:build",
        "engine.model=echo", "engine.default_model=false", "engine.batch_size=4", "job.repartition=2", *overrides])


def _login(mariadb: dict[str, object], user: str, password_file: object, database: str = "qwenspark"
           ) -> mysql.connector.MySQLConnection:
    return mysql.connector.connect(host="127.0.0.1", port=mariadb["port"], user=user, database=database,
                                   password=Path(str(password_file)).read_text().strip(), autocommit=True)


def _denied(conn: mysql.connector.MySQLConnection, sql: str) -> int:
    """The server's error number for sql, which must be a privilege refusal."""
    with pytest.raises(mysql.connector.Error) as caught, conn.cursor() as cur:
        cur.execute(sql)
        cur.fetchall()
    assert caught.value.errno in {*PRIVILEGE_DENIED, DATABASE_DENIED}, f"{sql}: {caught.value}"
    return int(caught.value.errno)


def root_sql(socket: object, sql: str) -> str:
    """sql as root through the socket (an operator's login); its tab-separated output."""
    return subprocess.run(["mariadb", "--no-defaults", f"--socket={socket}", "-uroot", "-N", "-e", sql],
                          check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture(scope="module")
def analysed(spark: SparkSession, mariadb: dict[str, object], tmp_path_factory: pytest.TempPathFactory
             ) -> QwenSparkConfig:
    """A batch run, then a stream micro-batch over reviews added after it, both as the job account."""
    tmp = tmp_path_factory.mktemp("privileges")
    cfg = _cfg(mariadb)
    reset_tables(cfg)
    load_reviews(cfg, _reviews(1, BATCH_REVIEWS), tmp)
    preflight.check(cfg, "batch")  # the server says the job's grants are enough
    summary = run_batch(spark, cfg)
    assert (summary.status, summary.rows_analysed, summary.rows_changed) == ("succeeded", BATCH_REVIEWS,
                                                                             BATCH_REVIEWS)
    load_reviews(cfg, _reviews(BATCH_REVIEWS + 1, STREAM_REVIEWS), tmp)
    stream = cfg.model_copy(update={"stream": cfg.stream.model_copy(update={
        "checkpoint_location": str(tmp / "checkpoint"), "available_now": True, "keepalive_seconds": 0.0,
        "gap_wait_seconds": 0.0, "start_after_id": BATCH_REVIEWS, "max_rows_per_batch": 64})})
    preflight.check(stream, "stream")
    run_stream(spark, stream)
    return cfg


def test_batch_and_stream_run_as_the_job_account_with_dml_only(
    analysed: QwenSparkConfig, mariadb: dict[str, object]
) -> None:
    total = BATCH_REVIEWS + STREAM_REVIEWS
    assert query(analysed, "SELECT COUNT(*) FROM review_sentiment WHERE error IS NULL")[0][0] == total
    assert query(analysed, "SELECT SUM(rows_selected) FROM stream_commits")[0][0] == STREAM_REVIEWS
    assert query(analysed, "SELECT COUNT(*), SUM(status = 'succeeded') FROM job_runs") == [(2, 2)]
    assert query(analysed, "SELECT SUM(reviews) FROM hotel_sentiment_daily")[0][0] == total
    # ... and the account that did it holds only its role: no database-wide privilege but temporary tables.
    with _login(mariadb, "qwenspark", mariadb["password_file"]) as conn, conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER(), CURRENT_ROLE()")
        assert cur.fetchall() == [("qwenspark@127.0.0.1", "qwenspark_job_role")]
        cur.execute("SHOW GRANTS")
        shown = [str(row[0]) for row in cur.fetchall()]
    assert any("ON `qwenspark`.`review_sentiment` TO `qwenspark_job_role`" in g for g in shown), shown
    assert [g for g in shown if " ON `qwenspark`.* " in g] == [
        "GRANT CREATE TEMPORARY TABLES ON `qwenspark`.* TO `qwenspark_job_role`"], shown
    assert not [g for g in shown if "ALL PRIVILEGES" in g], shown


def test_the_job_account_cannot_change_the_schema_nor_the_reviews(mariadb: dict[str, object]) -> None:
    with _login(mariadb, "qwenspark", mariadb["password_file"]) as conn:
        for sql in (
            "CREATE TABLE qs_t10_new (x INT)",
            "DROP TABLE review_sentiment",
            "ALTER TABLE review_sentiment ADD COLUMN qs_t10 INT",
            "CREATE INDEX qs_t10 ON job_runs (model)",
            "TRUNCATE TABLE job_runs",
            "CREATE OR REPLACE VIEW v_sentiment_mix AS SELECT 1 AS x",
            "DROP VIEW v_hotel_sentiment",
            f"DROP TABLE {migrate.SCHEMA_TABLE}",
            f"DELETE FROM {migrate.SCHEMA_TABLE}",
            "INSERT INTO hotel_reviews (review_id, hotel_id, created_at, text) VALUES (-10, 'H', NOW(), 'x')",
            "UPDATE hotel_reviews SET text = 'x' WHERE review_id = 1",
            "DELETE FROM hotel_reviews WHERE review_id = 1",
            "CREATE DATABASE qs_t10_db",
        ):
            _denied(conn, sql)
        with conn.cursor() as cur:  # what it may do, it can
            cur.execute("SELECT COUNT(*) FROM hotel_reviews")
            cur.fetchall()
            cur.execute("CREATE TEMPORARY TABLE qs_t10_tmp (x INT)")
            cur.execute("INSERT INTO qs_t10_tmp VALUES (1)")
    assert root_sql(mariadb["socket"], "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                    "'qwenspark' AND COLUMN_NAME = 'qs_t10'").strip() == "0"


def test_the_dashboard_account_reads_the_views_only(analysed: QwenSparkConfig, mariadb: dict[str, object]) -> None:
    views = grants.views()
    assert len(views) >= 4
    with _login(mariadb, "qwenspark_dashboard", mariadb["dashboard_password_file"]) as conn:
        with conn.cursor() as cur:
            for view in views:
                cur.execute(f"SELECT * FROM {view}")
                assert cur.fetchall(), f"{view} answered no rows"
            cur.execute("SELECT SUM(reviews) FROM v_hotel_sentiment")
            assert cur.fetchall()[0][0] == BATCH_REVIEWS + STREAM_REVIEWS
        for table in ("hotel_reviews", "review_sentiment", "hotel_sentiment_daily", "job_runs"):
            _denied(conn, f"SELECT * FROM {table}")
        for table in ("hotel_reviews", *grants.RESULT_TABLES, migrate.SCHEMA_TABLE):
            _denied(conn, f"INSERT INTO {table} () VALUES ()")
            _denied(conn, f"DELETE FROM {table}")
            _denied(conn, f"UPDATE {table} SET {_first_column(analysed, table)} = NULL")
        _denied(conn, "UPDATE v_hotel_sentiment SET reviews = 0")
        _denied(conn, "CREATE TABLE qs_t10_dash (x INT)")


def _first_column(cfg: QwenSparkConfig, table: str) -> str:
    return str(query(cfg, "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'qwenspark' "
                     f"AND TABLE_NAME = '{table}' ORDER BY ORDINAL_POSITION LIMIT 1")[0][0])


def _root_over_tcp(port: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mariadb", "--no-defaults", "-h127.0.0.1", f"-P{port}", "-uroot", "-e", "SELECT 1"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_root_logs_in_through_the_socket_only(mariadb: dict[str, object]) -> None:
    refused = _root_over_tcp(mariadb["port"])
    assert refused.returncode != 0 and "Access denied for user 'root'@'127.0.0.1'" in refused.stderr, refused
    assert root_sql(mariadb["socket"], "SELECT CURRENT_USER()").strip() == "root@localhost"
    accounts = root_sql(mariadb["socket"], "SELECT CONCAT(User, '@', Host) FROM mysql.user ORDER BY 1").split()
    assert [a for a in accounts if a.startswith("root@")] == ["root@localhost"]
    assert {"qwenspark@127.0.0.1", "qwenspark_admin@127.0.0.1", "qwenspark_dashboard@127.0.0.1"} <= set(accounts)
    for key in ("password_file", "admin_password_file", "dashboard_password_file"):  # generated, owner-only
        path = Path(str(mariadb[key]))
        assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_text().strip()) >= 16, path


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[DbServer]:
    """A server of this test only: its accounts are put back as an older release left them."""
    server = DbServer(tmp_path / "mariadb")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_start_repairs_the_folder_of_an_older_release(own_server: DbServer) -> None:
    socket = own_server.folder / "mysqld.sock"
    # What scripts/mariadb.sh of the release before this one made: root without a password, also on TCP, and the
    # job's account with ALL on its database, on TCP and on the socket.
    root_sql(socket, """
        CREATE USER 'root'@'127.0.0.1'; GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
        GRANT ALL PRIVILEGES ON qwenspark.* TO 'qwenspark'@'127.0.0.1';
        CREATE USER 'qwenspark'@'localhost'; GRANT ALL PRIVILEGES ON qwenspark.* TO 'qwenspark'@'localhost';
        ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('');""")
    assert _root_over_tcp(own_server.port).returncode == 0, "the older release's state was not made"

    own_server.start()  # already running: only the accounts are checked and repaired

    assert _root_over_tcp(own_server.port).returncode != 0
    assert root_sql(socket, "SELECT CURRENT_USER()").strip() == "root@localhost"
    grants_of = root_sql(socket, "SHOW GRANTS FOR 'qwenspark'@'127.0.0.1'")
    assert "ALL PRIVILEGES" not in grants_of and "qwenspark_job_role" in grants_of, grants_of
    assert root_sql(socket, "SELECT COUNT(*) FROM mysql.user WHERE User = 'qwenspark' AND Host = 'localhost'"
                    ).strip() == "0"
    plugin = root_sql(socket, "SELECT JSON_VALUE(Priv, '$.plugin') FROM mysql.global_priv WHERE User = 'root'")
    assert plugin.split() == ["unix_socket"]


def _columns(conn: mysql.connector.MySQLConnection, table: str) -> list[str]:
    with conn.cursor() as cur:
        cur.execute("SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                    "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION", (table,))
        return [str(r[0]) for r in cur.fetchall()]


def _rows(conn: mysql.connector.MySQLConnection, table: str, columns: list[str]) -> list[tuple[object, ...]]:
    """Every row of table in those columns, sorted here (the upgrade may change how the server orders ids)."""
    with conn.cursor() as cur:
        cur.execute(f"SELECT {', '.join(columns)} FROM {table}")
        return sorted(cur.fetchall(), key=repr)


def test_a_database_of_the_release_before_versions_upgrades_with_nothing_lost(
    analysed: QwenSparkConfig, mariadb: dict[str, object]
) -> None:
    """Tables of sql/schema.sql and views of sql/views.sql with the job's results in them, no schema version table:
    `qwenspark init-db` brings them to the current version; every row of every table is kept, the aggregates equal
    their recount, the views answer as before, and the job account can run on it at once."""
    root_sql(mariadb["socket"], f"DROP DATABASE IF EXISTS {OLD_DB}; CREATE DATABASE {OLD_DB};"
             f" GRANT ALL PRIVILEGES ON {OLD_DB}.* TO 'qwenspark_admin'@'127.0.0.1' WITH GRANT OPTION;")
    old = analysed.model_copy(update={"db": analysed.db.model_copy(update={"database": OLD_DB})})
    with db_sql.connect(old.db.owner(), autocommit=True) as conn:
        db_sql.run_script(conn, db_sql.sql_text("schema.sql"))
        old_views = [s for s in db_sql.statements(db_sql.sql_text("views.sql")) if "VIEW v_dash_" not in s]
        db_sql.run_script(conn, ";\n".join(old_views))
        columns = {t: _columns(conn, t) for t in ("hotel_reviews", *grants.RESULT_TABLES)}
        tables = [t for t, cols in columns.items() if cols]  # the release's tables (later ones are the migrations')
        with conn.cursor() as cur:
            for table in tables:  # the job's results, copied in the columns the old table has
                cols = ", ".join(columns[table])
                cur.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM qwenspark.{table}")
            cur.execute("INSERT INTO stream_rejects VALUES (UUID(), 0, 0, 'no review_id', '{\"text\": \"x\"}')")
        before = {t: _rows(conn, t, columns[t]) for t in tables}
        views_before = {v: _rows(conn, v, _columns(conn, v)) for v in OLD_VIEWS}
        assert len(old_views) == len(OLD_VIEWS) == 4
        assert migrate.applied_versions(conn) == set()
    assert all(before[t] for t in tables if t != "review_sentiment_stage"), "a table without rows proves nothing"

    out = subprocess.run(
        [sys.executable, "-m", "qwenspark.cli", "init-db", "--config", str(LOCAL), *(f"--set={s}" for s in [
            *server_sets(mariadb), f"db.database={OLD_DB}"])],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"schema at version {migrate.LATEST} in {OLD_DB}" in out.stdout and "as qwenspark_admin" in out.stdout

    with db_sql.connect(old.db.owner(), autocommit=True) as conn:
        assert migrate.applied_versions(conn) == set(migrate.VERSIONS)
        for table in tables:  # every row, in every column it had (migrations may add columns)
            assert _rows(conn, table, columns[table]) == before[table], f"{table} changed in the upgrade"
        for view, rows in views_before.items():
            assert _rows(conn, view, _columns(conn, view)) == rows, f"{view} answers differently"
    assert aggregate_mismatches(old) == {}
    preflight.check(old, "batch")  # the job account, through its role's new grants on this database



def test_an_account_without_its_default_role_is_told_the_grants_not_to_run_init_db(
    mariadb: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The role given but not made the default (a DBA's easy slip), the account holding a table grant by hand from
    an earlier release: it sees no schema version table, which must read as missing grants, not as a database
    that needs init-db."""
    user, password = "qs_t10_norole", "Pw-t10-norole"
    root_sql(mariadb["socket"], f"DROP USER IF EXISTS '{user}'@'127.0.0.1';"
             f" CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{password}';"
             f" GRANT qwenspark_job_role TO '{user}'@'127.0.0.1';")
    monkeypatch.setenv("QS_T10_PW", password)
    cfg = _cfg(mariadb, f"db.user={user}", "db.password_env=QS_T10_PW")
    with pytest.raises(ConfigError, match=rf"^user '{user}' \(db.user\) lacks a privilege the job needs: Access "
                       "denied .* to database 'qwenspark'; grant it on database 'qwenspark'"):
        preflight.check(cfg, "batch")  # nothing at all on the database: the login itself says so

    root_sql(mariadb["socket"], f"GRANT SELECT ON qwenspark.hotel_reviews TO '{user}'@'127.0.0.1'")
    with pytest.raises(ConfigError) as caught:
        preflight.check(cfg, "batch")
    line = str(caught.value)
    assert line.startswith(f"user '{user}' (db.user) lacks privileges the job needs: SELECT on qwenspark_schema; "
                           "SELECT, INSERT, UPDATE, DELETE on review_sentiment,"), line
    assert "no qwenspark schema" not in line
    assert "run `qwenspark init-db` to grant them to db.job_role 'qwenspark_job_role' (the account's default role)" \
        in line
    assert line.endswith(f"ON `qwenspark`.* TO '{user}'@'127.0.0.1'"), line

    root_sql(mariadb["socket"], f"SET DEFAULT ROLE qwenspark_job_role FOR '{user}'@'127.0.0.1'")
    preflight.check(cfg, "batch")  # with the role as its default, the same account passes


def test_init_db_with_a_wrong_owner_password_names_the_owner_keys(mariadb: dict[str, object], tmp_path: Path) -> None:
    wrong = tmp_path / "admin.password"
    wrong.write_text("Pw-t10-wrong\n")
    sets = [*server_sets(mariadb), f"db.admin_password_file={wrong}"]
    out = subprocess.run([sys.executable, "-m", "qwenspark.cli", "-q", "init-db", "--config", str(LOCAL),
                          *(f"--set={s}" for s in sets)], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("qwenspark: error: the database refused the login of user 'qwenspark_admin' "
                                 f"(db.admin_user) with the password from db.admin_password_file ({wrong})"), out.stderr
    assert "Pw-t10-wrong" not in out.stderr
