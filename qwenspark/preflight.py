"""Checks before Spark starts: the JDBC jar, the password, the database login and the privileges a job needs."""

from __future__ import annotations

import logging
import os
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from qwenspark.config import QwenSparkConfig
from qwenspark.errors import DATABASE_DENIED, NO_SUCH_TABLE, PRIVILEGE_DENIED, ConfigError, from_mysql
from qwenspark.io.grants import JOB_TABLES, TEMPORARY

if TYPE_CHECKING:
    from qwenspark.io.mysql import Connection

log = logging.getLogger(__name__)

Command = Literal["batch", "stream", "eval"]
_PROBE = "qwenspark_preflight_probe"


def check(cfg: QwenSparkConfig, command: Command) -> None:
    """Raise ConfigError (a setting or a grant to fix) or DatabaseError (the server is down) before Spark starts.

    eval reads a CSV and writes nothing to the database: nothing to check for it beyond the config's load.
    """
    if command == "eval":
        return
    check_jdbc_jar(cfg)
    check_database(cfg, reads_source=command == "batch" or cfg.stream.source == "mysql")


def check_jdbc_jar(cfg: QwenSparkConfig) -> None:
    """db.jdbc_jar exists and holds db.jdbc_driver, unless spark-submit already passed a MySQL/MariaDB jar."""
    if any(re.search(r"mariadb|mysql", Path(jar).name, re.I) for jar in _submitted_jars()):
        return  # session.merged_conf then leaves db.jdbc_jar out
    jar, driver = cfg.db.jdbc_jar, cfg.db.jdbc_driver
    if not jar.is_file():
        raise ConfigError(
            f"db.jdbc_jar: {jar} does not exist: install MariaDB Connector/J (Debian/Ubuntu: apt-get install "
            "libmariadb-java) and set db.jdbc_jar to its jar, or pass the jar with spark-submit --jars"
        )
    try:
        with zipfile.ZipFile(jar) as archive:
            archive.getinfo(driver.replace(".", "/") + ".class")
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"db.jdbc_jar: {jar} is not a readable jar: {exc}") from None
    except KeyError:
        raise ConfigError(f"db.jdbc_jar: {jar} has no class {driver} (db.jdbc_driver)") from None


def _submitted_jars() -> list[str]:
    # Only under spark-submit (its JVM is up and holds --jars); a plain `python` run has no Spark settings yet.
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        return []
    from qwenspark.session import submitted_conf

    return [j for j in submitted_conf().get("spark.jars", "").split(",") if j.strip()]


def check_database(cfg: QwenSparkConfig, *, reads_source: bool) -> None:
    """Log in, check the schema version (jobs never change the schema), then test every privilege the job uses."""
    password = cfg.db.password()  # ConfigError for a missing or empty password file, before any connection
    # Imported here: the checks before this one answer without loading the database client (about 1 s).
    import mysql.connector

    from qwenspark.io import migrate
    from qwenspark.io import mysql as db_sql

    try:
        with db_sql.connect(cfg.db, autocommit=True, password=password) as conn:
            applied = migrate.applied_versions(conn)
            # An account without any grant sees no schema table: that is a grant to fix, not a missing init-db.
            if applied or not _exists_unreadable(conn, migrate.SCHEMA_TABLE):
                migrate.check_version(applied, cfg.db)
                denied = missing_privileges(conn, cfg, reads_source=reads_source)
            else:
                denied = [("SELECT", migrate.SCHEMA_TABLE), *missing_privileges(conn, cfg, reads_source=reads_source)]
            account = _current_user(conn)
    except mysql.connector.Error as exc:
        raise from_mysql(exc, cfg.db) from None
    if denied:
        raise ConfigError(_denied_message(cfg, denied, account))


def _exists_unreadable(conn: Connection, table: str) -> bool:
    """Whether table exists but this login may not read it (False: readable or missing)."""
    import mysql.connector

    try:
        return not _allowed(conn, "SELECT", table)
    except mysql.connector.Error as exc:
        if exc.errno == NO_SUCH_TABLE:
            return False
        raise


def _visible_tables(conn: Connection) -> set[str]:
    # information_schema lists only what the user holds some privilege on: an invisible table counts as missing,
    # and creating it then names the grant that is missing.
    with conn.cursor() as cur:
        cur.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")
        return {str(row[0]) for row in cur.fetchall()}


def missing_privileges(conn: Connection, cfg: QwenSparkConfig, *, reads_source: bool) -> list[tuple[str, str]]:
    """(privilege, table) pairs the job needs and the login lacks, tested by EXPLAIN (nothing runs; the server
    applies every grant: global, database, table, roles), and a temporary table created and dropped."""
    needs: list[tuple[str, tuple[str, ...]]] = [(cfg.source.table, ("SELECT",))] if reads_source else []
    needs += list(JOB_TABLES.items())
    denied = [(priv, table) for table, privs in needs for priv in privs if not _allowed(conn, priv, table)]
    if not _may_create_temporary(conn):
        denied.append((TEMPORARY, cfg.db.database))
    return denied


def _probe_sql(conn: Connection, privilege: str, table: str) -> str:
    if privilege == "SELECT":
        return f"EXPLAIN SELECT 1 FROM {table} WHERE 1 = 0"
    if privilege == "INSERT":
        return f"EXPLAIN INSERT INTO {table} () VALUES ()"
    if privilege == "DELETE":
        return f"EXPLAIN DELETE FROM {table} WHERE 1 = 0"
    column = _first_column(conn, table)
    return f"EXPLAIN UPDATE {table} SET {column} = {column} WHERE 1 = 0"


def _first_column(conn: Connection, table: str) -> str:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
            " ORDER BY ORDINAL_POSITION LIMIT 1",
            (table.rsplit(".", 1)[-1].strip("`"),),
        )
        row = cur.fetchone()
    return f"`{row[0]}`" if row else "review_id"


def _allowed(conn: Connection, privilege: str, table: str) -> bool:
    """Whether the server lets this login run `privilege` on table; other errors (no such table) propagate."""
    import mysql.connector

    try:
        with conn.cursor() as cur:
            cur.execute(_probe_sql(conn, privilege, table))
            cur.fetchall()
    except mysql.connector.Error as exc:
        if exc.errno in PRIVILEGE_DENIED:
            return False
        raise
    return True


def _may_create_temporary(conn: Connection) -> bool:
    import mysql.connector

    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TEMPORARY TABLE {_PROBE} (x INT)")
            cur.execute(f"DROP TEMPORARY TABLE {_PROBE}")
    except mysql.connector.Error as exc:
        if exc.errno == DATABASE_DENIED or exc.errno in PRIVILEGE_DENIED:
            return False
        raise
    return True


def _current_user(conn: Connection) -> str:
    with conn.cursor() as cur:
        cur.execute("SELECT CURRENT_USER()")
        user, _, host = str(cur.fetchone()[0]).rpartition("@")
    return f"'{user}'@'{host}'"


def _denied_message(cfg: QwenSparkConfig, denied: list[tuple[str, str]], account: str) -> str:
    # Tables lacking the same privileges are listed together: "INSERT, UPDATE, DELETE on a, b, c" keeps the line
    # (at most 800 characters) short as tables are added.
    by_table: dict[str, list[str]] = {}
    for privilege, table in denied:
        by_table.setdefault(table, []).append(privilege)
    by_privileges: dict[tuple[str, ...], list[str]] = {}
    for table, privileges in by_table.items():
        by_privileges.setdefault(tuple(privileges), []).append(table)
    lacks = "; ".join(f"{', '.join(privs)} on {', '.join(tables)}" for privs, tables in by_privileges.items())
    grant = ", ".join(dict.fromkeys(privilege for privilege, _ in denied))
    role = cfg.db.job_role
    # Short: the whole message is one line of at most 800 characters, and the table list comes first.
    how = (f"run `qwenspark init-db` to grant them to db.job_role {role!r} (the account's default role), or grant "
           "them, e.g. " if role else "grant them, e.g. ")
    return (
        f"user {cfg.db.user!r} (db.user) lacks privileges the job needs: {lacks}; {how}"
        f"GRANT {grant} ON `{cfg.db.database}`.* TO {account}"
    )
