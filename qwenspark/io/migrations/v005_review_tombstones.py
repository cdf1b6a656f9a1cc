"""v005: review_tombstones, the purged reviews that a run which read them earlier must not write back."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenspark.io.migrate import Migrator

VERSION = 5
NAME = "review tombstones"


def apply(m: Migrator) -> None:
    """Create the table (a run's commit skips staged rows of reviews purged after the run read its input)."""
    m.execute(
        "CREATE TABLE IF NOT EXISTS review_tombstones ("
        " review_id BIGINT NOT NULL PRIMARY KEY,"
        " input_seq BIGINT NOT NULL COMMENT 'input sequence when purged: runs that read before are older',"
        " purged_at DATETIME(3) NOT NULL"
        ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"
    )
