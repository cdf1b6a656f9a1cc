"""Transactional SQL beside Spark: the commit of a run's staged rows, job_runs bookkeeping (schema: io.migrate)."""

from __future__ import annotations

import functools
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import mysql.connector
from mysql.connector.constants import ClientFlag
from pydantic import SecretStr

from qwenspark.config import DbConfig, SourceConfig
from qwenspark.errors import SinkError, SourceError
from qwenspark.faults import failpoint
from qwenspark.io.migrations.v003_result_versions import SEQUENCE_TABLE

log = logging.getLogger(__name__)

Connection = Any  # mysql.connector's connection classes share no public base type
T = TypeVar("T")


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
        # A host that drops packets must not hang a job (or its preflight) for the whole TCP timeout.
        connection_timeout=10,
    )
    try:
        yield conn
    finally:
        try:
            conn.close()
        except mysql.connector.Error:  # the server is gone: an error on the way out must not hide the first one
            log.debug("closing a broken connection", exc_info=True)


def run_script(conn: Connection, script: str, params: Mapping[str, Any] | None = None) -> list[int]:
    """Execute each statement of script; returns their rowcounts (in order)."""
    counts = []
    with conn.cursor() as cur:
        for stmt in statements(script):
            cur.execute(stmt, dict(params) if params and "%(" in stmt else None)
            counts.append(cur.rowcount)
    return counts


STAGE = "review_sentiment_stage"


def _stage_ddl() -> str:
    for stmt in statements(sql_text("schema.sql")):
        if stmt.startswith(f"CREATE TABLE IF NOT EXISTS {STAGE} ("):
            return stmt
    raise SinkError(f"schema.sql has no {STAGE} table")


def _stage_is_current(cur: Any) -> bool:
    cur.execute(
        "SELECT COUNT(*) FROM information_schema.COLUMNS"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'stage_seq'",
        (STAGE,),
    )
    return bool(cur.fetchone()[0])


def migrate_stage(conn: Connection) -> str | None:
    """Bring a staging table of the old layout (PRIMARY KEY (run_id, review_id), no stage_seq) to the current one.

    The old key made a Spark write task that was retried after a partial write fail on its own rows. Detected
    through information_schema; an empty old table is dropped and created from schema.sql, one that holds rows
    (a run that failed before its commit, or one still staging) is altered in place, keeping them (each gets a
    stage_seq of its own). Only schema v001 calls it, under init-db's migration lock (migrate.migrate).
    Returns 'recreated', 'altered' or None (nothing to do). conn must be in autocommit mode (DDL).
    """
    with conn.cursor() as cur:
        if _stage_is_current(cur):
            return None
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {STAGE})")
        if not cur.fetchone()[0]:
            cur.execute(f"DROP TABLE {STAGE}")
            cur.execute(_stage_ddl())
            action = "recreated"
        else:
            cur.execute(
                f"ALTER TABLE {STAGE} ADD COLUMN stage_seq BIGINT UNSIGNED NOT NULL DEFAULT (UUID_SHORT())"
                " COMMENT 'arrival order: the latest copy wins',"
                " DROP PRIMARY KEY, ADD PRIMARY KEY (run_id, review_id, stage_seq)"
            )
            action = "altered"
    log.warning("%s had the old layout (unique (run_id, review_id)): %s with stage_seq", STAGE, action)
    return action


@dataclass(frozen=True)
class StageSummary:
    """What a run staged, counted over the latest copy of each review (the copies a commit keeps)."""

    rows: int  # staged rows, duplicates included
    reviews: int  # distinct review ids
    ok: int
    errors: int
    truncated: int
    tokens_in: int
    tokens_out: int
    input_errors: int = 0  # errors found before the model (empty:, invalid:): not the model's doing

    @property
    def model_errors(self) -> int:
        """Rows the model (or the engine) was asked about whose result is an error."""
        return self.errors - self.input_errors

    @property
    def duplicates(self) -> int:
        """Older copies of reviews staged twice (a retried Spark write task): dropped by the commit."""
        return self.rows - self.reviews


# Error prefixes of rows that never reached the model (qwenspark.clean): they say nothing of the engine's health.
INPUT_ERROR_PREFIXES = ("empty:", "invalid:")
_SUMS = (
    "COALESCE(SUM(error IS NULL), 0), COALESCE(SUM(error IS NOT NULL), 0), COALESCE(SUM(truncated), 0),"
    " COALESCE(SUM(tokens_in), 0), COALESCE(SUM(tokens_out), 0),"
    " COALESCE(SUM(" + " OR ".join(f"LEFT(error, {len(p)}) = '{p}'" for p in INPUT_ERROR_PREFIXES) + "), 0)"
)
_LATEST = (
    "s.stage_seq = (SELECT MAX(d.stage_seq) FROM review_sentiment_stage d"
    " WHERE d.run_id = s.run_id AND d.review_id = s.review_id)"
)


def stage_summary(conn: Connection, run_id: str) -> StageSummary:
    """Counts of run_id's staged rows; ends conn's transaction (a fresh snapshot sees what Spark wrote)."""
    conn.rollback()
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT COUNT(*), COUNT(DISTINCT review_id), {_SUMS} FROM review_sentiment_stage WHERE run_id = %s",
            (run_id,),
        )
        rows, reviews, *sums = (int(v) for v in cur.fetchone())
        if rows != reviews:  # sum over the latest copy of each review only
            cur.execute(f"SELECT {_SUMS} FROM review_sentiment_stage s WHERE s.run_id = %s AND {_LATEST}", (run_id,))
            sums = [int(v) for v in cur.fetchone()]
    conn.rollback()
    return StageSummary(rows, reviews, *sums)


def top_errors(conn: Connection, run_id: str, limit: int = 3) -> list[tuple[str, int]]:
    """The run's most frequent staged model-side errors (first 160 characters) and how often each occurs."""
    inputs = " AND ".join(f"LEFT(error, {len(p)}) <> '{p}'" for p in INPUT_ERROR_PREFIXES)
    with conn.cursor() as cur:
        cur.execute(
            f"SELECT LEFT(error, 160) AS e, COUNT(*) FROM review_sentiment_stage WHERE run_id = %s"
            f" AND error IS NOT NULL AND {inputs} GROUP BY e ORDER BY COUNT(*) DESC LIMIT %s",
            (run_id, limit),
        )
        found = [(str(e), int(n)) for e, n in cur.fetchall()]
    conn.rollback()
    return found


INPUT_SEQ = "input"  # job_runs.input_seq: taken when a run starts, before it reads its input
COMMIT_SEQ = "commit"  # job_runs.commit_seq: taken inside a run's last commit transaction (the Delta version)


def next_seq(conn: Connection, name: str) -> int:
    """The next value of sequence `name`, in conn's transaction.

    Its row stays locked until that transaction ends: a value taken inside a commit transaction orders commits
    (a later value is handed out only after the earlier transaction committed or rolled back).
    """
    with conn.cursor() as cur:
        cur.execute(f"UPDATE {SEQUENCE_TABLE} SET value = LAST_INSERT_ID(value + 1) WHERE name = %s", (name,))
        if cur.rowcount != 1:
            raise SinkError(f"sequence {name!r} is missing from {SEQUENCE_TABLE}: run `qwenspark init-db`")
        cur.execute("SELECT LAST_INSERT_ID()")
        return int(cur.fetchone()[0])


def take_seq(db: DbConfig, name: str) -> int:
    """next_seq in a transaction of its own (committed at once)."""
    with connect(db, autocommit=True) as conn:
        return next_seq(conn, name)


MIN_REVIEW_ID, MAX_REVIEW_ID = -(2**63), 2**63 - 1
COMMIT_WORKERS = 2  # connections committing chunks of one run at once (each chunk is its own transaction)
COMMIT_LOCK = "qwenspark.commit."  # + the database: one run commits at a time (released when its session ends)
COMMIT_LOCK_TIMEOUT_S = 3600
CHUNK_ATTEMPTS = 5  # a chunk rolled back by a deadlock or a lock wait timeout is tried again
_RETRYABLE = {1205, 1213}  # ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK


def _chunk_end(cur: Any, run_id: str, lo: int, chunk_rows: int) -> int | None:
    """The last review_id of the chunk that starts at lo: at most chunk_rows staged rows; None: the rest fits."""
    cur.execute(
        "SELECT review_id FROM review_sentiment_stage WHERE run_id = %s AND review_id >= %s"
        " ORDER BY review_id, stage_seq LIMIT 1 OFFSET %s",
        (run_id, lo, chunk_rows),
    )
    row = cur.fetchone()
    if row is None:
        return None
    first_out = int(row[0])  # the first row past chunk_rows: its review starts the next chunk
    cur.execute(
        "SELECT MIN(review_id) FROM review_sentiment_stage WHERE run_id = %s AND review_id >= %s", (run_id, lo)
    )
    first_in = int(cur.fetchone()[0])
    # One review staged more than chunk_rows times: its copies go together.
    return first_out - 1 if first_out > first_in else first_in


def plan_chunks(conn: Connection, run_id: str, chunk_rows: int) -> list[tuple[int, int]]:
    """run_id's staged rows as review_id ranges (inclusive) of at most chunk_rows staged rows each, in order.

    Every copy of a review falls in one range; the last range is open-ended. Nothing staged: one range.
    """
    chunks = []
    lo = MIN_REVIEW_ID
    with conn.cursor() as cur:
        while (end := _chunk_end(cur, run_id, lo, chunk_rows)) is not None:
            chunks.append((lo, end))
            lo = end + 1
    chunks.append((lo, MAX_REVIEW_ID))
    return chunks


def script_sections(script: str) -> dict[str, list[str]]:
    """The statements of each `-- @name` section of script, in order (statements before the first are dropped)."""
    sections: dict[str, list[str]] = {}
    name: str | None = None
    body: list[str] = []
    for line in [*script.splitlines(), "-- @"]:
        if m := re.match(r"--\s*@(\w*)", line):
            if name:
                sections[name] = statements("\n".join(body))
            name, body = m.group(1), []
        else:
            body.append(line)
    return sections


@functools.cache
def _upsert_sections() -> dict[str, list[str]]:
    # Read and split once per process, not once per chunk.
    return script_sections(sql_text("upsert.sql"))


def _span(chunk: tuple[int, int]) -> str:
    lo, hi = chunk
    return f"{'' if lo == MIN_REVIEW_ID else lo}..{'' if hi == MAX_REVIEW_ID else hi}"


class Counts(NamedTuple):
    """What a commit did to review_sentiment."""

    changed: int  # rows this run wrote (inserted or changed); identical rows (a replay) are not counted
    stale: int = 0  # reviews it analysed but did not write: a run that read newer input had stored them

    def plus(self, other: Counts) -> Counts:
        """The sum of two chunks' counts."""
        return Counts(self.changed + other.changed, self.stale + other.stale)


class CommitConflict(SinkError):
    """Another writer inserted a review of the chunk after the chunk read it: the chunk is rolled back, tried again."""


def commit_chunk(
    conn: Connection, run_id: str, lo: int, hi: int, *, max_rows: int, input_seq: int | None, dedupe: bool = True
) -> Counts:
    """sql/upsert.sql for run_id's staged reviews lo..hi (at most max_rows distinct), in conn's open transaction.

    input_seq: the run's job_runs.input_seq (the staleness guard). Returns what the chunk wrote and left stale.
    """
    params = {"run_id": run_id, "lo": lo, "hi": hi, "dedupe": int(dedupe), "heap_bytes": (1 << 20) + 64 * max_rows,
              "input_seq": input_seq}
    sections = _upsert_sections()
    affected = 0
    with conn.cursor() as cur:

        def run(section: str) -> None:
            nonlocal affected
            for stmt in sections[section]:
                cur.execute(stmt, params if "%(" in stmt else None)
                if cur.with_rows:  # the locking read of @changes
                    cur.fetchall()
                if stmt.startswith("INSERT INTO review_sentiment ("):
                    affected = max(int(cur.rowcount), 0)

        run("changes")
        failpoint("sink.upsert", lo)  # inside the chunk's open transaction (the DB kill tests)
        cur.execute("SELECT COUNT(*), COALESCE(SUM(is_new), 0), COALESCE(@stale_rows, 0) FROM tmp_chunk")
        changed_rows, new_rows, stale_rows = (int(v) for v in cur.fetchone())
        if changed_rows:
            run("delta_tables")
            run("deltas")
            if changed_rows > new_rows:
                run("old")
            run("upsert")
            # ON DUPLICATE KEY UPDATE reports 1 per insert, 2 per changed row (identical rows never reach it).
            # Anything else: a review counted new was inserted by another writer meanwhile (its old version is
            # missing from the aggregate deltas, and the guard never saw it); the caller rolls back and retries.
            if affected != new_rows + 2 * (changed_rows - new_rows):
                raise CommitConflict(
                    f"run {run_id}: chunk {_span((lo, hi))} expected to insert {new_rows} and update "
                    f"{changed_rows - new_rows} rows, the server reports {affected} affected: another writer")
            run("apply")
        run("spent")
    return Counts(changed_rows, stale_rows)


ChunkHook = Callable[[Connection, Counts], None]


def _session(conn: Connection) -> None:
    # Chunks of one run commit in parallel on their own review_id ranges: READ COMMITTED takes no gap locks, which
    # two chunks inserting beside each other would deadlock on. Other runs do not commit meanwhile (COMMIT_LOCK).
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, CommitConflict) or (isinstance(exc, mysql.connector.Error) and exc.errno in _RETRYABLE)


def in_transaction(conn: Connection, what: str, work: Callable[[], T]) -> T:
    """work() then COMMIT on conn; the whole transaction is run again when InnoDB rolled it back for a deadlock
    or a lock wait timeout (or a CommitConflict), up to CHUNK_ATTEMPTS times. work must be safe to repeat."""
    for attempt in range(1, CHUNK_ATTEMPTS + 1):
        try:
            result = work()
            conn.commit()
            return result
        except Exception as exc:
            try:
                conn.rollback()
            except mysql.connector.Error:  # the connection is gone: the first error says why
                log.debug("%s: rollback failed", what, exc_info=True)
            if not _retryable(exc) or attempt == CHUNK_ATTEMPTS:
                raise
            log.warning("%s rolled back (%s), attempt %d of %d", what, exc, attempt + 1, CHUNK_ATTEMPTS)
            time.sleep(0.05 * attempt)
    raise AssertionError("unreachable")


def _run_chunk(
    conn: Connection, run_id: str, chunk: tuple[int, int], chunk_rows: int, dedupe: bool, *, input_seq: int | None
) -> Counts:
    """One chunk in its own transaction (committed here; retried, see in_transaction)."""
    return in_transaction(
        conn, f"run {run_id}: chunk {_span(chunk)}",
        lambda: commit_chunk(conn, run_id, *chunk, max_rows=chunk_rows, input_seq=input_seq, dedupe=dedupe))


def commit_run(
    db: DbConfig,
    run_id: str,
    *,
    chunk_rows: int,
    input_seq: int | None = None,
    workers: int | None = None,
    dedupe: bool = True,
    finish: ChunkHook | None = None,
    progress: Callable[[Counts], None] | None = None,
) -> Counts:
    """Move run_id's staged rows into review_sentiment in bounded transactions; returns what they wrote.

    Chunks: the run's staged rows are cut into review_id ranges of at most chunk_rows staged rows (every copy of a
    review in the same range; plan_chunks). Each chunk is ONE transaction (sql/upsert.sql): it keeps the latest
    copy of each review, upserts the reviews that change, applies their contributions to hotel_sentiment_daily
    and aspect_sentiment, and deletes the chunk's staged rows. Up to `workers` (default COMMIT_WORKERS) chunks
    commit at once, each on its own connection: they touch disjoint reviews, and the aggregate rows they share
    are updated additively under row locks (a chunk rolled back by a deadlock is tried again).

    The LAST transaction runs finish(conn, counts) (pipeline: the job_runs update to 'succeeded', its commit_seq,
    and the caller's hook, e.g. the stream's stream_commits row) before its COMMIT, after every chunk committed. A
    run of one chunk (every stream micro-batch, any run of up to chunk_rows staged rows) is a single transaction:
    data, aggregates and finish together; a longer run ends with a transaction of its own for finish. Every one of
    these transactions is run again when InnoDB rolls it back for a deadlock or a lock wait timeout
    (in_transaction): finish must be safe to repeat. progress(counts so far) runs after each chunk's COMMIT.
    dedupe=False skips the latest-copy filter (for a run known to hold one copy per review). One run commits at a
    time on a database (named lock COMMIT_LOCK + database): the chunk transactions run at READ COMMITTED, and the
    stored versions they subtract from the aggregates must not change under them; each chunk also locks the stored
    rows it reads and checks the rows its upsert affected (sql/upsert.sql), so a writer that bypasses the lock
    makes a chunk retry rather than skew the aggregates.

    Many writers: input_seq is the run's job_runs.input_seq, taken before it read its input. A review stored by a
    run with a higher input_seq (newer input) is left as it is and counted stale (sql/upsert.sql, @changes).
    Counts.changed: 1 per review this run inserted or changed, 0 per identical one (a replay changes 0 rows) or
    stale one.

    A crash or an error between chunks leaves: the chunks committed so far are final results of this run, each
    review once, and the aggregates match review_sentiment (every chunk commits its own aggregate changes); a
    failing chunk is rolled back whole; the rest stays staged and the run stays 'running' in job_runs until it is
    marked failed (pipeline._mark_failed, or abandon_runs after a dead driver), which drops those staged rows.
    A rerun of the same selection finds the committed reviews current (their input_key matches, clean.skip_done)
    and analyses only the rest, so each review lands exactly once. finish runs only in the last transaction: a
    crash before it leaves no stream_commits row, and the stream replays the batch, whose committed reviews are
    skipped as current.
    """
    with connect(db) as conn:
        _session(conn)
        with holding_commit_lock(conn, db, f"run {run_id}"):
            conn.rollback()  # a fresh snapshot sees all that Spark committed
            chunks = plan_chunks(conn, run_id, chunk_rows)
            conn.rollback()
            if len(chunks) == 1:

                def single() -> Counts:
                    counts = commit_chunk(conn, run_id, *chunks[0], max_rows=chunk_rows, input_seq=input_seq,
                                          dedupe=dedupe)
                    if finish is not None:
                        finish(conn, counts)
                    return counts

                counts = in_transaction(conn, f"run {run_id}: commit", single)
                if progress is not None:
                    progress(counts)
            else:
                counts = _commit_chunks(
                    db, run_id, chunks, chunk_rows=chunk_rows, workers=workers or COMMIT_WORKERS, dedupe=dedupe,
                    input_seq=input_seq, progress=progress,
                )
                if finish is not None:
                    hook = finish
                    in_transaction(conn, f"run {run_id}: finish", lambda: hook(conn, counts))
    log.info("run %s: %d staged chunk(s) committed, %d rows changed, %d stale", run_id, len(chunks), *counts)
    return counts


def _commit_chunks(
    db: DbConfig,
    run_id: str,
    chunks: list[tuple[int, int]],
    *,
    chunk_rows: int,
    workers: int,
    dedupe: bool,
    input_seq: int | None,
    progress: Callable[[Counts], None] | None,
) -> Counts:
    """Commit every chunk, up to `workers` at once; after a failure no further chunk starts. What they wrote."""
    todo: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
    for chunk in chunks:
        todo.put(chunk)
    totals = [Counts(0)]  # what the chunks committed so far wrote
    done = [0]  # chunks committed
    errors: list[BaseException] = []
    guard = threading.Lock()

    def worker() -> None:
        try:
            with connect(db) as conn:
                _session(conn)
                while not errors:
                    try:
                        chunk = todo.get_nowait()
                    except queue.Empty:
                        return
                    counts = _run_chunk(conn, run_id, chunk, chunk_rows, dedupe, input_seq=input_seq)
                    with guard:
                        total = totals[0] = totals[0].plus(counts)
                        committed = done[0] = done[0] + 1
                    log.info("run %s: chunk %d of %d (review_id %s) committed, %d rows changed, %d stale", run_id,
                             committed, len(chunks), _span(chunk), *counts)
                    if progress is not None:
                        progress(total)
                    failpoint("sink.between_chunks", committed)
        except BaseException as exc:  # handed to the caller's thread
            with guard:
                errors.append(exc)

    threads = [threading.Thread(target=worker, name=f"commit-{i}") for i in range(max(1, min(workers, len(chunks))))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except BaseException as exc:  # e.g. KeyboardInterrupt: no further chunk starts; the running ones end
        with guard:
            errors.append(exc)
        for t in threads:
            t.join()
        raise
    if errors:
        raise errors[0]
    return totals[0]


def commit_lock_name(db: DbConfig) -> str:
    """The named lock under which one writer at a time changes review_sentiment and the aggregates on db."""
    return f"{COMMIT_LOCK}{db.database}"[:64]


@contextmanager
def named_lock(conn: Connection, name: str, timeout_s: int, busy: Callable[[], Exception]) -> Iterator[None]:
    """Hold the server's named lock `name` on conn while the block runs; raise busy() when another session held
    it for timeout_s. A session that is gone on the way out has released the lock with it."""
    with conn.cursor() as cur:
        cur.execute("SELECT GET_LOCK(%s, %s)", (name, timeout_s))
        if cur.fetchone()[0] != 1:
            raise busy()
    try:
        yield
    finally:
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT RELEASE_LOCK(%s)", (name,))
                cur.fetchall()
        except mysql.connector.Error:
            log.debug("named lock %s not released explicitly", name, exc_info=True)


def holding_commit_lock(conn: Connection, db: DbConfig, what: str) -> AbstractContextManager[None]:
    """Hold the commit lock on conn while the block runs (waits up to COMMIT_LOCK_TIMEOUT_S for a commit)."""
    return named_lock(conn, commit_lock_name(db), COMMIT_LOCK_TIMEOUT_S,
                      lambda: SinkError(f"{what}: another run held the commit lock for {COMMIT_LOCK_TIMEOUT_S} s"))


@functools.cache
def _purge_sections() -> dict[str, list[str]]:
    return script_sections(sql_text("purge.sql"))


# tmp_chunk's statements in upsert.sql's @changes: the purge fills the same table, which @old reads.
_CHUNK_DDL = ("DROP TEMPORARY TABLE IF EXISTS tmp_chunk", "SET SESSION max_heap_table_size",
              "CREATE TEMPORARY TABLE tmp_chunk")


def purge_deleted(db: DbConfig, source: SourceConfig, *, chunk_rows: int) -> int:
    """Remove the results of reviews that no longer exist in source.table (within source.min_id/max_id); how many.

    Hard deletes leave a review's result and its share of hotel_sentiment_daily / aspect_sentiment behind. Each
    chunk of at most chunk_rows such results is ONE transaction: upsert.sql's @old subtracts their stored
    versions, sql/purge.sql deletes them, @apply applies the deltas (keys left with no review are deleted), so the
    aggregates match review_sentiment after every chunk. Each chunk holds the commit lock: no run commits during
    it, so the stored versions subtracted are the ones deleted; between chunks the lock is free, so a stream's
    micro-batches are not held up by a long purge. Each purged review gets a tombstone (review_tombstones, with
    an input sequence value taken as the purge starts): a run that read the review before it was deleted and
    commits after the purge does not write it back (counted stale). A review re-inserted into the source is new
    to the next run, which read it after the purge. One deleted while a run that read it commits, before any
    purge saw it, keeps that result until the next purge.
    """
    upsert, purge = _upsert_sections(), _purge_sections()
    chunk_ddl = [stmt for stmt in upsert["changes"] if stmt.startswith(_CHUNK_DDL)]
    select = [stmt.replace("{source}", source.table) for stmt in purge["select"]]
    hi = MAX_REVIEW_ID if source.max_id is None else source.max_id
    params: dict[str, Any] = {"limit": chunk_rows, "hi": hi, "heap_bytes": (1 << 20) + 64 * chunk_rows,
                              "input_seq": take_seq(db, INPUT_SEQ)}
    purged = 0
    with connect(db) as conn:
        _session(conn)
        start = MIN_REVIEW_ID if source.min_id is None else source.min_id
        while start <= hi:
            params["lo"] = start

            def chunk() -> tuple[int, int, int]:
                with conn.cursor() as cur:
                    for stmt in [*chunk_ddl, *upsert["delta_tables"], *select]:
                        cur.execute(stmt, params if "%(" in stmt else None)
                    cur.execute("SELECT COUNT(*), MAX(review_id) FROM tmp_chunk")
                    found, last = cur.fetchone()
                    if not found:
                        return 0, 0, hi
                    for stmt in upsert["old"]:
                        cur.execute(stmt, params if "%(" in stmt else None)
                    for stmt in purge["delete"]:
                        cur.execute(stmt, params if "%(" in stmt else None)
                    deleted = int(cur.rowcount)  # the DELETE's, the last statement
                    for stmt in upsert["apply"]:
                        cur.execute(stmt, params if "%(" in stmt else None)
                return int(found), deleted, int(last)

            what = f"purge of deleted reviews from review_id {start}"
            with holding_commit_lock(conn, db, what):
                found, deleted, last = in_transaction(conn, what, chunk)
            purged += deleted
            if found < chunk_rows or last >= hi:  # the scan reached hi
                break
            start = last + 1
    return purged


def _delete_stage(conn: Connection, run_id: str, batch_rows: int) -> int:
    """Delete run_id's staged rows in transactions of at most batch_rows rows (conn in autocommit); how many."""
    deleted = 0
    with conn.cursor() as cur:
        while True:
            cur.execute(
                "DELETE FROM review_sentiment_stage WHERE run_id = %s ORDER BY review_id, stage_seq LIMIT %s",
                (run_id, batch_rows),
            )
            count = int(cur.rowcount)
            deleted += max(count, 0)
            if count < batch_rows:
                return deleted


def delete_stage(db: DbConfig, run_id: str, batch_rows: int = 50_000) -> int:
    """Drop a failed run's staged rows, in bounded transactions: rows its committed chunks did not take.

    Whatever chunks of the run committed before it failed stay in the result tables (see commit_run).
    """
    with connect(db, autocommit=True) as conn:
        return _delete_stage(conn, run_id, batch_rows)


def insert_run(db: DbConfig, row: Mapping[str, Any]) -> None:
    """Record a run as started (committed at once, so a crashed run stays visible as 'running')."""
    cols = ", ".join(row)
    marks = ", ".join(f"%({c})s" for c in row)
    with connect(db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"INSERT INTO job_runs ({cols}) VALUES ({marks})", dict(row))


def update_run(conn: Connection, run_id: str, fields: Mapping[str, Any], *, while_running: bool = False) -> None:
    """Set job_runs fields of run_id on conn (inside the caller's transaction when autocommit is off).

    while_running: only if the run is still 'running', else SinkError (another start abandoned it meanwhile).
    """
    sets = ", ".join(f"{c} = %({c})s" for c in fields)
    guard = " AND status = 'running'" if while_running else ""
    with conn.cursor() as cur:
        cur.execute(f"UPDATE job_runs SET {sets} WHERE run_id = %(run_id)s{guard}", {**fields, "run_id": run_id})
        if while_running and cur.rowcount != 1:
            raise SinkError(f"run {run_id} is no longer 'running' in job_runs: it was marked abandoned meanwhile")


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


RUN_LOCK = "qwenspark.run."  # + run_id: held by the driver of a running run, for as long as it runs


def run_lock_name(run_id: str) -> str:
    """The named lock that says run_id's driver is alive."""
    return f"{RUN_LOCK}{run_id}"


@contextmanager
def run_lease(db: DbConfig, run_id: str) -> Iterator[Connection]:
    """Hold run_id's lock on a connection of its own while the run runs; yields that connection.

    MariaDB releases a named lock when its session ends: a driver that dies (or loses its database) leaves a
    'running' run whose lock is free, which the next start recognises as abandoned (abandon_runs). The session
    is kept open however long the run takes (wait_timeout raised: a model stage may run for hours).
    """
    with connect(db, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.execute("SET SESSION wait_timeout = 31536000")
            cur.execute("SELECT GET_LOCK(%s, 0)", (run_lock_name(run_id),))
            if cur.fetchone()[0] != 1:
                raise SinkError(f"run {run_id}: its lock is held elsewhere")
        yield conn


def lease_held(conn: Connection, run_id: str) -> bool:
    """Whether conn still holds run_id's lock (False once the server restarted or dropped the session)."""
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID()", (run_lock_name(run_id),))
            row = cur.fetchone()
        return bool(row and row[0])
    except mysql.connector.Error:
        return False


def abandon_runs(db: DbConfig, job: str | None = None, batch_rows: int = 50_000) -> int:
    """Mark 'running' runs whose driver is gone as failed and drop their staged rows; returns how many.

    A run is abandoned when its lock (run_lease) is free: its driver died, or lost its database session, before
    it committed. Runs of live drivers (another batch, a stream) hold their locks and are left alone. job limits
    it to one job's runs (None: all). The staged rows go first, in bounded transactions, then the status: a
    crash in between leaves the run 'running', and the next call finishes the job. Chunks such a run committed
    before its driver died stay: they are final (see commit_run), and a rerun analyses only what they did not
    cover.
    """
    abandoned = 0
    with connect(db, autocommit=True) as conn, conn.cursor() as cur:
        if job is None:
            cur.execute("SELECT run_id FROM job_runs WHERE status = 'running'")
        else:
            cur.execute("SELECT run_id FROM job_runs WHERE job = %s AND status = 'running'", (job,))
        for (run_id,) in cur.fetchall():
            cur.execute("SELECT IS_FREE_LOCK(%s)", (run_lock_name(run_id),))
            if cur.fetchone()[0] != 1:  # its driver is alive
                continue
            _delete_stage(conn, run_id, batch_rows)
            cur.execute(
                "UPDATE job_runs SET status = 'failed', finished_at = UTC_TIMESTAMP(3),"
                " message = 'abandoned: its driver (or its database session) ended before the run committed;"
                " its staged rows were dropped and a rerun analyses what it did not commit'"
                " WHERE run_id = %s AND status = 'running'",
                (run_id,),
            )
            abandoned += max(int(cur.rowcount), 0)
    return abandoned


# Bookkeeping rows the retention deletes per transaction: short row locks beside running jobs and dashboards.
PURGE_BATCH_ROWS = 1000


def purge_history(db: DbConfig, days: int, batch_rows: int = PURGE_BATCH_ROWS) -> tuple[int, int]:
    """Delete job_runs rows (never 'running' ones), stream_commits rows and review_tombstones older than `days`;
    returns the counts of the first two.

    DML only, in transactions of at most batch_rows rows (keys first, then a delete by primary key: portable and
    safe to replicate). The latest stream_commits row of each query stays whatever its age: a restarted query's
    replay of its last batch is checked against it (batch_committed). stream_rejects stay: they hold the only copy
    of rows no result covers. days <= 0 deletes nothing.
    """
    if days <= 0:
        return 0, 0
    runs = commits = 0
    with connect(db, autocommit=True) as conn, conn.cursor() as cur:
        while True:
            cur.execute(
                "SELECT c.query_id, c.batch_id FROM stream_commits c"
                " JOIN (SELECT query_id, MAX(batch_id) AS last FROM stream_commits GROUP BY query_id) q"
                " ON q.query_id = c.query_id"
                " WHERE c.batch_id < q.last AND c.committed_at < UTC_TIMESTAMP(3) - INTERVAL %s DAY LIMIT %s",
                (days, batch_rows),
            )
            keys = list(cur.fetchall())
            deleted = 0
            if keys:
                marks = ", ".join(["(%s, %s)"] * len(keys))
                cur.execute(f"DELETE FROM stream_commits WHERE (query_id, batch_id) IN ({marks})",
                            [v for key in keys for v in key])
                deleted = int(cur.rowcount)
                commits += deleted
            if len(keys) < batch_rows or not deleted:
                break
        while True:
            cur.execute(
                "SELECT run_id FROM job_runs WHERE status <> 'running'"
                " AND COALESCE(finished_at, started_at) < UTC_TIMESTAMP(3) - INTERVAL %s DAY LIMIT %s",
                (days, batch_rows),
            )
            ids = [row[0] for row in cur.fetchall()]
            deleted = 0
            if ids:
                cur.execute(f"DELETE FROM job_runs WHERE run_id IN ({', '.join(['%s'] * len(ids))})"
                            " AND status <> 'running'", ids)
                deleted = int(cur.rowcount)
                runs += deleted
            if len(ids) < batch_rows or not deleted:
                break
        # Tombstones only matter to runs that read their review before the purge: none is older than `days`
        # unless it is still running (a run's lease ends with its driver).
        cur.execute(
            "DELETE FROM review_tombstones WHERE purged_at < UTC_TIMESTAMP(3) - INTERVAL %s DAY"
            " AND input_seq < COALESCE((SELECT MIN(input_seq) FROM job_runs WHERE status = 'running'), %s)"
            " LIMIT %s", (days, MAX_REVIEW_ID, batch_rows))
    return runs, commits


def apply_retention(db: DbConfig, days: int) -> None:
    """purge_history at a run's start; a failure (a lock wait beside a busy writer) is logged, never fails a run."""
    if days <= 0:
        return
    try:
        runs, commits = purge_history(db, days)
    except mysql.connector.Error as exc:
        log.warning("job.retention_days: could not delete old job_runs / stream_commits rows (%s); the next run"
                    " tries again", exc)
        return
    if runs or commits:
        log.info("job.retention_days=%d: deleted %d job_runs and %d stream_commits rows", days, runs, commits)
