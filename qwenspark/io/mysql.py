"""Transactional SQL beside Spark: schema creation, the run's upsert transaction and job_runs bookkeeping."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import mysql.connector
from mysql.connector.constants import ClientFlag
from pydantic import SecretStr

from qwenspark.config import DbConfig
from qwenspark.errors import SinkError, SourceError

log = logging.getLogger(__name__)

Connection = Any  # mysql.connector's connection classes share no public base type


def sql_text(name: str) -> str:
    """A file of the packaged sql/ folder."""
    return resources.files("qwenspark").joinpath("sql", name).read_text(encoding="utf-8")


def statements(script: str) -> list[str]:
    """Split a script on semicolons at line ends, dropping comments (our scripts hold no ; in strings)."""
    body = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in re.split(r";\s*$", body, flags=re.MULTILINE) if s.strip()]


@contextmanager
def connect(db: DbConfig, *, autocommit: bool = False, password: SecretStr | None = None) -> Iterator[Connection]:
    """A connection whose rowcount is rows CHANGED (no FOUND_ROWS): an idempotent replay reports 0."""
    conn = mysql.connector.connect(
        host=db.host,
        port=db.port,
        user=db.user,
        password=(password or db.password()).get_secret_value(),
        database=db.database,
        charset="utf8mb4",
        collation="utf8mb4_unicode_ci",
        autocommit=autocommit,
        client_flags=[-ClientFlag.FOUND_ROWS],
        time_zone="+00:00",
    )
    try:
        yield conn
    finally:
        conn.close()


def run_script(conn: Connection, script: str, params: Mapping[str, Any] | None = None) -> list[int]:
    """Execute each statement of script; returns their rowcounts (in order)."""
    counts = []
    with conn.cursor() as cur:
        for stmt in statements(script):
            cur.execute(stmt, dict(params) if params and "%(" in stmt else None)
            counts.append(cur.rowcount)
    return counts


def ensure_schema(db: DbConfig) -> None:
    """Create the tables and dashboard views if missing (idempotent)."""
    with connect(db, autocommit=True) as conn:
        run_script(conn, sql_text("schema.sql"))
        run_script(conn, sql_text("views.sql"))


def upsert_run(conn: Connection, run_id: str) -> int:
    """Inside the caller's transaction: move the run's staged rows; returns review_sentiment rows changed."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*) FROM review_sentiment_stage s LEFT JOIN review_sentiment r"
            " ON r.review_id = s.review_id WHERE s.run_id = %s AND r.review_id IS NULL",
            (run_id,),
        )
        (new_rows,) = cur.fetchone()
    script = sql_text("upsert.sql")
    for stmt, affected in zip(statements(script), run_script(conn, script, {"run_id": run_id}), strict=True):
        if stmt.startswith("INSERT INTO review_sentiment ("):
            # ON DUPLICATE KEY UPDATE reports 1 per insert, 2 per changed row, 0 per identical row.
            return int(new_rows) + (affected - int(new_rows)) // 2
    raise SinkError("upsert.sql has no review_sentiment upsert")


def stage_counts(conn: Connection, run_id: str) -> tuple[int, int]:
    """(rows, distinct review ids) staged for run_id."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT COUNT(*), COUNT(DISTINCT review_id) FROM review_sentiment_stage WHERE run_id = %s", (run_id,)
        )
        rows, distinct = cur.fetchone()
    return int(rows), int(distinct)


def delete_stage(db: DbConfig, run_id: str) -> None:
    """Drop a failed run's staged rows (they were never visible in the result tables)."""
    with connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("DELETE FROM review_sentiment_stage WHERE run_id = %s", (run_id,))


def insert_run(db: DbConfig, row: Mapping[str, Any]) -> None:
    """Record a run as started (committed at once, so a crashed run stays visible as 'running')."""
    cols = ", ".join(row)
    marks = ", ".join(f"%({c})s" for c in row)
    with connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO job_runs ({cols}) VALUES ({marks})", dict(row))


def update_run(conn: Connection, run_id: str, fields: Mapping[str, Any]) -> None:
    """Set job_runs fields of run_id on conn (inside the caller's transaction when autocommit is off)."""
    sets = ", ".join(f"{c} = %({c})s" for c in fields)
    with conn.cursor() as cur:
        cur.execute(f"UPDATE job_runs SET {sets} WHERE run_id = %(run_id)s", {**fields, "run_id": run_id})


def load_reviews_csv(db: DbConfig, path: Path) -> tuple[int, int]:
    """Upsert reviews from a CSV (review_id, hotel_id, created_at, lang, rating, text); (rows, changed)."""
    import pandas as pd

    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError) as exc:
        raise SourceError(f"cannot read reviews from {path}: {exc}") from exc
    cols = ["review_id", "hotel_id", "created_at", "lang", "rating", "text"]
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise SourceError(f"{path} lacks columns {missing}")
    rows = [
        (int(rid), hotel, created, lang or None, int(rating) if rating else None, text)
        for rid, hotel, created, lang, rating, text in df[cols].itertuples(index=False, name=None)
    ]
    sql = (
        "INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON DUPLICATE KEY UPDATE hotel_id = VALUES(hotel_id),"
        " created_at = VALUES(created_at), lang = VALUES(lang), rating = VALUES(rating), text = VALUES(text)"
    )
    with connect(db) as conn, conn.cursor() as cur:
        changed = 0
        for start in range(0, len(rows), 1000):
            cur.executemany(sql, rows[start : start + 1000])
            changed += max(cur.rowcount, 0)
        conn.commit()
    return len(rows), changed


def batch_committed(db: DbConfig, query_id: str, batch_id: int) -> bool:
    """Whether the streaming query already committed this micro-batch (a replay after a crash)."""
    with connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1 FROM stream_commits WHERE query_id = %s AND batch_id = %s", (query_id, batch_id))
        return cur.fetchone() is not None


def record_batch(conn: Connection, row: Mapping[str, Any], rejects: list[tuple[str, str]]) -> None:
    """Inside the batch's transaction: its stream_commits row and its rejected rows (reason, raw JSON)."""
    cols = ", ".join(row)
    marks = ", ".join(f"%({c})s" for c in row)
    with conn.cursor() as cur:
        # A second commit of one batch fails on the primary key and rolls the whole transaction back.
        cur.execute(f"INSERT INTO stream_commits ({cols}, committed_at) VALUES ({marks}, UTC_TIMESTAMP(3))", dict(row))
        if rejects:
            cur.executemany(
                "INSERT INTO stream_rejects (query_id, batch_id, seq, reason, raw) VALUES (%s, %s, %s, %s, %s)",
                [(row["query_id"], row["batch_id"], i, reason, raw) for i, (reason, raw) in enumerate(rejects)],
            )


def abandon_runs(db: DbConfig, job: str) -> int:
    """Mark runs of job still 'running' as failed and drop their staged rows (their driver died); returns how many."""
    with connect(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT run_id FROM job_runs WHERE job = %s AND status = 'running' FOR UPDATE", (job,))
        run_ids = [r[0] for r in cur.fetchall()]
        for run_id in run_ids:
            cur.execute("DELETE FROM review_sentiment_stage WHERE run_id = %s", (run_id,))
            cur.execute(
                "UPDATE job_runs SET status = 'failed', finished_at = UTC_TIMESTAMP(3),"
                " message = 'abandoned: its driver stopped before the commit; the batch is replayed'"
                " WHERE run_id = %s",
                (run_id,),
            )
        conn.commit()
    return len(run_ids)
