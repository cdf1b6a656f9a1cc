"""v001: the tables of the releases before schema versioning (sql/schema.sql), staging table in its current layout."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenspark.io.migrate import Migrator

VERSION = 1
NAME = "base tables"


def apply(m: Migrator) -> None:
    """CREATE ... IF NOT EXISTS of every table; an older staging table is migrated in place."""
    from qwenspark.io.mysql import migrate_stage

    m.script("schema.sql")
    migrate_stage(m.conn)
