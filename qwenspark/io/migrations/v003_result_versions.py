"""v003: result versions for many writers: a sequence table, the input and commit versions of each run and row."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenspark.io.migrate import Migrator

VERSION = 3
NAME = "result versions"

SEQUENCE_TABLE = "qwenspark_sequence"
# Epoch milliseconds of a DATETIME(3) in UTC, independent of the session's time zone: the Delta app-transaction
# versions of earlier releases (delta.run_version of job_runs.finished_at).
_EPOCH_MS = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {}) DIV 1000"


def apply(m: Migrator) -> None:
    """Create the sequences, add the version columns, and carry the Delta versions already used over."""
    m.execute(
        f"CREATE TABLE IF NOT EXISTS {SEQUENCE_TABLE} ("
        " name  VARCHAR(32)     NOT NULL PRIMARY KEY,"
        " value BIGINT UNSIGNED NOT NULL COMMENT 'last value handed out (mysql.next_seq)'"
        ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci")
    m.add_column("job_runs", "input_seq",
                 "BIGINT UNSIGNED NULL COMMENT 'taken before the run read its input: the version of what it read'")
    m.add_column("job_runs", "commit_seq",
                 "BIGINT UNSIGNED NULL COMMENT 'taken inside its last commit transaction: commit order, Delta version'")
    m.add_column("job_runs", "rows_stale",
                 "INT NULL COMMENT 'reviews analysed but not written: a run that read newer input had stored them'")
    m.add_index("job_runs", "ix_job_runs_commit_seq", "commit_seq")
    m.add_column("review_sentiment", "input_seq",
                 "BIGINT UNSIGNED NULL COMMENT 'job_runs.input_seq of the run that wrote the row (NULL: before v003)'")
    # Runs committed before v003 keep the Delta version they had (their finished_at in ms), so a Delta copy that
    # lags behind catches them up in order; the 'commit' sequence starts above every such version (and above
    # now: a Delta table may hold versions of runs whose job_runs rows were pruned).
    m.execute(f"UPDATE job_runs SET commit_seq = {_EPOCH_MS.format('finished_at')}"
              " WHERE status = 'succeeded' AND finished_at IS NOT NULL AND commit_seq IS NULL")
    m.execute(
        f"INSERT IGNORE INTO {SEQUENCE_TABLE} (name, value)"
        f" SELECT 'commit', GREATEST({_EPOCH_MS.format('UTC_TIMESTAMP(3)')}, COALESCE(MAX(commit_seq), 0))"
        " FROM job_runs")
    m.execute(f"INSERT IGNORE INTO {SEQUENCE_TABLE} (name, value) VALUES ('input', 0)")
