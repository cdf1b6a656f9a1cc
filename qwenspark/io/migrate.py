"""Versioned schema migrations: what `qwenspark init-db` applies, and the version check every run makes (DML only).

The database records the migrations applied to it in SCHEMA_TABLE, one row per version. A run never changes the
schema: it checks that the database is at this release's version (require_current) and stops with an error that
says to run `qwenspark init-db` when it is older (or to upgrade qwenspark when it is newer). init-db, run by a user
allowed to change the schema, applies the missing migrations in order, then (re)creates the dashboard views.

A migration is a module qwenspark/io/migrations/vNNN_<name>.py with VERSION, NAME and apply(m: Migrator). DDL
commits by itself in MySQL, so a migration cannot be one transaction: each step checks the catalogue first
(Migrator.add_column, ...), and a migration that stopped half-way is finished by running init-db again.
Databases made by releases before versioning (tables, no SCHEMA_TABLE) are brought in by v001, whose statements
are those releases' own idempotent DDL.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import SecretStr

from qwenspark.config import DbConfig
from qwenspark.errors import ConfigError, SinkError
from qwenspark.io import migrations
from qwenspark.io.mysql import Connection, connect, named_lock, run_script, script_sections, sql_text

log = logging.getLogger(__name__)

SCHEMA_TABLE = "qwenspark_schema"
LOCK = "qwenspark.migrate."
LOCK_TIMEOUT_S = 120


class SchemaVersionError(ConfigError):
    """The database's schema is not the version this release needs: init-db (or an upgrade) is required."""


@dataclass(frozen=True)
class Migration:
    """One schema version: applied in order, once."""

    version: int
    name: str
    apply: Callable[[Migrator], None]


def _load() -> list[Migration]:
    found: list[Migration] = []
    for info in pkgutil.iter_modules(migrations.__path__):
        if not info.name.startswith("v"):
            continue
        module: ModuleType = importlib.import_module(f"{migrations.__name__}.{info.name}")
        found.append(Migration(int(module.VERSION), str(module.NAME), module.apply))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise AssertionError(f"two migrations share a version: {versions}")
    return found


MIGRATIONS = _load()
VERSIONS = frozenset(m.version for m in MIGRATIONS)
LATEST = MIGRATIONS[-1].version


class Migrator:
    """The catalogue checks and idempotent DDL steps a migration is written with (conn in autocommit)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.cur: Any = conn.cursor()
        self.cur.execute("SELECT VERSION()")
        self.mariadb = "mariadb" in str(self.cur.fetchone()[0]).lower()

    @property
    def id_collation(self) -> str:
        """An exact (binary, no-pad) utf8mb4 collation: 'H01', 'h01', 'H01 ' and 'Ｈ０１' stay four ids."""
        return "utf8mb4_nopad_bin" if self.mariadb else "utf8mb4_0900_bin"

    def execute(self, sql: str, params: tuple[Any, ...] | None = None) -> None:
        """Run one statement."""
        self.cur.execute(sql, params)
        if self.cur.with_rows:
            self.cur.fetchall()

    def script(self, name: str, *sections: str) -> None:
        """Run a packaged sql/ script (statements split by mysql.statements), or only the named `-- @name`
        sections of it, in the order given (a migration runs what exists at its version)."""
        if not sections:
            run_script(self.conn, sql_text(name))
            return
        parts = script_sections(sql_text(name))
        for section in sections:
            for stmt in parts[section]:
                self.execute(stmt)

    def scalar(self, sql: str, params: tuple[Any, ...] | None = None) -> Any:
        """The first column of the first row (None when there is none)."""
        self.cur.execute(sql, params)
        rows = self.cur.fetchall()
        return rows[0][0] if rows else None

    def has_table(self, table: str) -> bool:
        """Whether the table (or view) exists in the current database."""
        return bool(self.scalar(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (table,)))

    def column(self, table: str, column: str) -> dict[str, Any] | None:
        """The column's information_schema row (DATA_TYPE, COLLATION_NAME, ...), None when it does not exist."""
        self.cur.execute(
            "SELECT * FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
            " AND COLUMN_NAME = %s", (table, column))
        rows = self.cur.fetchall()
        return dict(zip(self.cur.column_names, rows[0], strict=True)) if rows else None

    def has_index(self, table: str, index: str) -> bool:
        """Whether the table has an index of that name."""
        return bool(self.scalar(
            "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
            " AND INDEX_NAME = %s", (table, index)))

    def add_column(self, table: str, column: str, definition: str) -> bool:
        """ALTER TABLE table ADD COLUMN column definition, unless it exists; whether it was added."""
        if self.column(table, column) is not None:
            return False
        self.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        return True

    def add_index(self, table: str, index: str, columns: str) -> bool:
        """ALTER TABLE table ADD INDEX index (columns), unless it exists; whether it was added."""
        if self.has_index(table, index):
            return False
        self.execute(f"ALTER TABLE {table} ADD INDEX {index} ({columns})")
        return True

    def close(self) -> None:
        """Close the cursor."""
        self.cur.close()


def applied_versions(conn: Connection) -> set[int]:
    """The migrations the database records as applied (none before the first init-db, unversioned releases too)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (SCHEMA_TABLE,))
        if not cur.fetchone()[0]:
            return set()
        cur.execute(f"SELECT version FROM {SCHEMA_TABLE}")
        return {int(row[0]) for row in cur.fetchall()}


def check_version(applied: set[int], db: DbConfig) -> None:
    """Raise SchemaVersionError unless exactly this release's migrations are applied."""
    where = f"database {db.database} on {db.host}:{db.port}"
    unknown = sorted(applied - VERSIONS)
    if unknown:
        raise SchemaVersionError(
            f"{where} has schema migration(s) {', '.join(f'v{v:03d}' for v in unknown)} that this release of "
            f"qwenspark does not know (it knows up to v{LATEST:03d}): upgrade qwenspark on this machine")
    missing = sorted(VERSIONS - applied)
    if missing:
        state = "has no qwenspark schema" if not applied else f"is at schema version {max(applied)}"
        raise SchemaVersionError(
            f"{where} {state}; this release needs version {LATEST}: run `qwenspark init-db --config ...` as a user "
            "allowed to change the schema (jobs use DML only and never change it)")


def require_current(db: DbConfig) -> None:
    """What every run does instead of DDL: stop unless the database is at this release's schema version."""
    with connect(db, autocommit=True) as conn:
        check_version(applied_versions(conn), db)


def migrate(db: DbConfig, *, password: SecretStr | None = None, views: bool = True) -> list[int]:
    """Apply the missing migrations in order (serialised by a named lock); returns the versions applied.

    The dashboard views are (re)created afterwards when anything was applied, a view is missing or views=True
    (init-db: CREATE OR REPLACE VIEW also repairs a view someone changed). Logs in as the schema owner
    (db.admin_user, else db.user); password: the owner's, when it is not read from the config.
    """
    with connect(db.owner(), autocommit=True, password=password) as conn:
        m = Migrator(conn)
        busy = f"another init-db held the migration lock for {LOCK_TIMEOUT_S} s"
        try:
            with named_lock(conn, f"{LOCK}{db.database}"[:64], LOCK_TIMEOUT_S, lambda: SinkError(busy)):
                m.execute(
                    f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} ("
                    " version INT NOT NULL PRIMARY KEY, name VARCHAR(128) NOT NULL,"
                    " applied_at DATETIME(3) NOT NULL, applied_by VARCHAR(255) NOT NULL"
                    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci")
                done = applied_versions(conn)
                if done - VERSIONS:
                    check_version(done, db)
                applied = []
                for migration in (x for x in MIGRATIONS if x.version not in done):
                    log.info("schema: applying v%03d %s", migration.version, migration.name)
                    migration.apply(m)
                    m.execute(
                        f"INSERT INTO {SCHEMA_TABLE} (version, name, applied_at, applied_by)"
                        " VALUES (%s, %s, UTC_TIMESTAMP(3), CURRENT_USER())", (migration.version, migration.name))
                    applied.append(migration.version)
                if applied or views:
                    m.script("views.sql")
                return applied
        finally:
            m.close()
