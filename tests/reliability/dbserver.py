"""The database side of the reliability tests: a MariaDB that can be killed with SIGKILL and started again on the
same data folder, and a recount of the aggregates from review_sentiment.

The session server (tests/conftest.py) is shared by every test and must never die; the DB kill tests need one of
their own. Started and stopped by scripts/mariadb.sh (MARIADB_DIR, MARIADB_PORT), as the session server is; killed
by pid (the script's pid file) from the test or from a failpoint command ($QWENSPARK_FAILPOINT_EXEC) inside the
job; a restart runs InnoDB's crash recovery on the same folder, as a real outage does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.io import mysql

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mariadb.sh"


def free_port() -> int:
    """A TCP port nothing listens on now (127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _state(pid: int) -> str | None:
    """The process state letter (R, S, Z, ...) from /proc, or None when the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]  # the command name may hold spaces and ')'


class DbServer:
    """One mariadbd on 127.0.0.1:port with its data under folder; killable (kill9) and restartable (start)."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.password_file = folder / "qwenspark.password"  # the job's account; the schema owner's beside it
        self.admin_password_file = folder / "qwenspark-admin.password"
        self.pid_file = folder / "mysqld.pid"
        self.kills = 0

    def _script(self, action: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "MARIADB_DIR": str(self.folder), "MARIADB_PORT": str(self.port)}
        return subprocess.run([str(SCRIPT), action], env=env, capture_output=True, text=True, timeout=120, check=False)

    def start(self) -> None:
        """Start the server (initialising the folder the first time); after a kill -9 this is crash recovery."""
        done = self._script("start")
        if done.returncode != 0:
            errors = self.folder / "error.log"
            log = errors.read_text(errors="replace")[-3000:] if errors.exists() else ""
            raise RuntimeError(f"mariadb.sh start failed ({done.returncode}): {done.stdout}{done.stderr}\n{log}")

    def stop(self) -> None:
        """A clean shutdown if it is up; the process is gone when this returns."""
        pid = self.pid()
        self._script("stop")
        if pid is not None:
            self._wait_gone(pid, timeout=60)

    def pid(self) -> int | None:
        """mariadbd's pid while it runs (from its pid file), else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _state(pid) not in (None, "Z") else None

    def crashed(self) -> str:
        """The first line of each crash mariadbd reported itself (a SIGKILL leaves none); "" if none."""
        log = self.folder / "error.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return "; ".join(line.strip() for line in text.splitlines() if "got signal" in line)

    def alive(self) -> bool:
        """Whether the server takes TCP connections."""
        with socket.socket() as sock:
            sock.settimeout(1.0)
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def kill9(self) -> int:
        """SIGKILL mariadbd (no shutdown, no flush: InnoDB recovers at the next start); returns its pid."""
        pid = self.pid()
        if pid is None:
            raise RuntimeError(f"no mariadbd running for {self.folder}")
        os.kill(pid, signal.SIGKILL)
        self._wait_gone(pid, timeout=30)
        self.kills += 1
        return pid

    def kill_command(self) -> str:
        """A shell command that SIGKILLs this server (for $QWENSPARK_FAILPOINT_EXEC): idempotent, and it names
        the process it kills by pid and command, so a later call never hits another process that took the pid."""
        pid = self.pid()
        if pid is None:
            raise RuntimeError(f"no mariadbd running for {self.folder}")
        return f'[ "$(cat /proc/{pid}/comm 2>/dev/null)" = mariadbd ] && kill -9 {pid}; true'

    def _wait_gone(self, pid: int, timeout: float) -> None:
        # A killed server may stay a zombie (its parent, the start script, exited; PID 1 reaps it when it will):
        # what counts is that it no longer runs nor listens.
        deadline = time.monotonic() + timeout
        while _state(pid) not in (None, "Z") or self.alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"mariadbd {pid} still running after {timeout} s")
            time.sleep(0.05)

    def config(self, overrides: list[str] | None = None) -> QwenSparkConfig:
        """conf/local.yaml pointed at this server, with the echo engine (as the suite's echo_cfg) and overrides."""
        return load_config(
            ROOT / "conf" / "local.yaml",
            [
                f"db.port={self.port}",
                f"db.password_file={self.password_file}",
                "db.password_env=QWENSPARK_TEST_NO_SUCH_VAR",
                f"db.admin_password_file={self.admin_password_file}",
                "db.admin_password_env=QWENSPARK_TEST_NO_SUCH_VAR",
                "engine.kind=custom",
                "engine.factory=tests.support.echo_engine:build",
                "engine.model=echo",
                "engine.default_model=false",
                "engine.batch_size=16",
                *(overrides or []),
            ],
        )


# The aggregates recounted from review_sentiment, as sql/upsert.sql defines them (reviews without a hotel or a date
# count nowhere; aspects of analysed reviews only), independently of the incremental path that maintains them.
DAILY_RECOUNT = """
SELECT hotel_id, DATE(review_created_at) AS day, COUNT(*) AS reviews, SUM(error IS NULL) AS analysed,
  SUM(sentiment <=> 'positive') AS positive, SUM(sentiment <=> 'negative') AS negative,
  SUM(sentiment <=> 'neutral') AS neutral, SUM(sentiment <=> 'mixed') AS mixed, SUM(error IS NOT NULL) AS errors
FROM review_sentiment WHERE hotel_id IS NOT NULL AND review_created_at IS NOT NULL
GROUP BY hotel_id, DATE(review_created_at)"""
ASPECT_RECOUNT = """
SELECT r.hotel_id, DATE(r.review_created_at) AS day, jt.aspect, COUNT(*) AS mentions,
  SUM(jt.sentiment <=> 'positive') AS positive, SUM(jt.sentiment <=> 'negative') AS negative,
  SUM(jt.sentiment <=> 'neutral') AS neutral
FROM review_sentiment r
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE r.error IS NULL AND jt.aspect IS NOT NULL AND r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL
GROUP BY r.hotel_id, DATE(r.review_created_at), jt.aspect"""
# The dashboard's per-language summaries (schema v006): the same counts per language, lang '' for NULL, as bytes.
DAILY_LANG_RECOUNT = """
SELECT hotel_id, DATE(review_created_at) AS day, CAST(COALESCE(lang, '') AS BINARY) AS lang, COUNT(*) AS reviews,
  SUM(error IS NULL) AS analysed, SUM(sentiment <=> 'positive') AS positive, SUM(sentiment <=> 'negative') AS negative,
  SUM(sentiment <=> 'neutral') AS neutral, SUM(sentiment <=> 'mixed') AS mixed, SUM(error IS NOT NULL) AS errors
FROM review_sentiment WHERE hotel_id IS NOT NULL AND review_created_at IS NOT NULL
GROUP BY hotel_id, DATE(review_created_at), CAST(COALESCE(lang, '') AS BINARY)"""
ASPECT_LANG_RECOUNT = """
SELECT r.hotel_id, DATE(r.review_created_at) AS day, CAST(COALESCE(r.lang, '') AS BINARY) AS lang, jt.aspect,
  COUNT(*) AS mentions, SUM(jt.sentiment <=> 'positive') AS positive, SUM(jt.sentiment <=> 'negative') AS negative,
  SUM(jt.sentiment <=> 'neutral') AS neutral
FROM review_sentiment r
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE r.error IS NULL AND jt.aspect IS NOT NULL AND r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL
GROUP BY r.hotel_id, DATE(r.review_created_at), CAST(COALESCE(r.lang, '') AS BINARY), jt.aspect"""
# The monthly rollups (v007): the same recounts per month (its first day) instead of per day.
def _per_month(recount: str, column: str) -> str:
    month = f"DATE({column}) - INTERVAL (DAYOFMONTH({column}) - 1) DAY"
    return recount.replace(f"DATE({column}) AS day", "{m} AS month").replace(f"DATE({column})", month).replace(
        "{m}", month)


MONTHLY_LANG_RECOUNT = _per_month(DAILY_LANG_RECOUNT, "review_created_at")
ASPECT_MONTHLY_RECOUNT = _per_month(ASPECT_LANG_RECOUNT, "r.review_created_at")
_COMPARE = {
    "hotel_sentiment_daily": (DAILY_RECOUNT, ("hotel_id", "day"),
                              ("reviews", "analysed", "positive", "negative", "neutral", "mixed", "errors")),
    "aspect_sentiment": (ASPECT_RECOUNT, ("hotel_id", "day", "aspect"),
                         ("mentions", "positive", "negative", "neutral")),
    "sentiment_daily_lang": (DAILY_LANG_RECOUNT, ("hotel_id", "day", "lang"),
                             ("reviews", "analysed", "positive", "negative", "neutral", "mixed", "errors")),
    "aspect_daily_lang": (ASPECT_LANG_RECOUNT, ("hotel_id", "day", "lang", "aspect"),
                          ("mentions", "positive", "negative", "neutral")),
    "sentiment_monthly_lang": (MONTHLY_LANG_RECOUNT, ("hotel_id", "month", "lang"),
                               ("reviews", "analysed", "positive", "negative", "neutral", "mixed", "errors")),
    "aspect_monthly_lang": (ASPECT_MONTHLY_RECOUNT, ("hotel_id", "month", "lang", "aspect"),
                            ("mentions", "positive", "negative", "neutral")),
}


def aggregate_mismatches(cfg: QwenSparkConfig) -> dict[str, list[tuple[object, ...]]]:
    """Keys whose stored aggregate differs from the recount, both ways (stored rows without reviews too); {} if
    none. Keys are matched by the server, under the tables' collation, as their primary keys are."""
    out: dict[str, list[tuple[object, ...]]] = {}
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        for table, (recount, keys, counts) in _COMPARE.items():
            on = " AND ".join(f"t.{k} = r.{k}" for k in keys)
            same = " AND ".join(f"t.{c} = r.{c}" for c in counts)
            cur.execute(f"SELECT 'recount', r.* FROM ({recount}) r LEFT JOIN {table} t ON {on}"
                        f" WHERE t.{keys[0]} IS NULL OR NOT ({same})")
            wrong = list(cur.fetchall())
            cur.execute(f"SELECT 'stored', t.* FROM {table} t LEFT JOIN ({recount}) r ON {on}"
                        f" WHERE r.{keys[0]} IS NULL")
            wrong += list(cur.fetchall())
            if wrong:
                out[table] = wrong
    return out
