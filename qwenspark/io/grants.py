"""Least privilege: the tables the jobs write, and the GRANTs `qwenspark init-db` gives the job and dashboard roles.

The job needs DML only: SELECT on the source table and on the schema version table, SELECT/INSERT/UPDATE/DELETE on
the result tables, CREATE TEMPORARY TABLES (the commit's chunk tables). The dashboard needs SELECT on the views,
which run with their definer's (the schema owner's) rights, so it never reads a table itself. Grants go to roles
(db.job_role, db.dashboard_role), not to accounts: a DBA creates the roles and gives them to the accounts once, and
init-db keeps the table grants current as migrations add tables.
"""

from __future__ import annotations

import re
from importlib import resources

from qwenspark.config import QwenSparkConfig
from qwenspark.io.migrations.v003_result_versions import SEQUENCE_TABLE

# What the jobs do to a result table (upserts, bookkeeping, dropping staged rows, retention).
RESULT_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
# Every table the jobs write, with what they do to it. A migration that adds one adds it here, so that preflight
# tests it and init-db grants it (e.g. a sequence table the jobs only read and bump: ("SELECT", "INSERT", "UPDATE")).
JOB_TABLES: dict[str, tuple[str, ...]] = {
    "review_sentiment": RESULT_PRIVILEGES,
    "review_sentiment_stage": RESULT_PRIVILEGES,
    "job_runs": RESULT_PRIVILEGES,
    "hotel_sentiment_daily": RESULT_PRIVILEGES,
    "aspect_sentiment": RESULT_PRIVILEGES,
    "sentiment_daily_lang": RESULT_PRIVILEGES,  # the dashboard's per-language summaries (schema v006)
    "aspect_daily_lang": RESULT_PRIVILEGES,
    "sentiment_monthly_lang": RESULT_PRIVILEGES,  # their monthly rollups (schema v007)
    "aspect_monthly_lang": RESULT_PRIVILEGES,
    "stream_commits": RESULT_PRIVILEGES,
    "stream_rejects": RESULT_PRIVILEGES,
    "review_tombstones": RESULT_PRIVILEGES,  # written by the purge, read by the commit, pruned by the retention
    SEQUENCE_TABLE: ("SELECT", "INSERT", "UPDATE"),  # input and commit versions (mysql.next_seq)
}
RESULT_TABLES = tuple(JOB_TABLES)
# The commit builds its chunks in temporary tables (sql/upsert.sql).
TEMPORARY = "CREATE TEMPORARY TABLES"


def views() -> list[str]:
    """The dashboard views (sql/views.sql), in creation order."""
    script = (resources.files("qwenspark") / "sql" / "views.sql").read_text(encoding="utf-8")
    return re.findall(r"CREATE OR REPLACE VIEW (\w+)", script)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def job_grants(cfg: QwenSparkConfig, role: str) -> list[str]:
    """The GRANT statements that give role exactly what a batch or stream run does."""
    from qwenspark.io.migrate import SCHEMA_TABLE  # read by every run's version check

    db = _q(cfg.db.database)
    grants = [f"GRANT SELECT ON {db}.{_q(table)} TO {role}" for table in (cfg.source.table, SCHEMA_TABLE)]
    grants += [f"GRANT {', '.join(privs)} ON {db}.{_q(table)} TO {role}" for table, privs in JOB_TABLES.items()]
    grants.append(f"GRANT {TEMPORARY} ON {db}.* TO {role}")
    return grants


def dashboard_grants(cfg: QwenSparkConfig, role: str) -> list[str]:
    """The GRANT statements that let role read the dashboard views and nothing else."""
    return [f"GRANT SELECT ON {_q(cfg.db.database)}.{_q(view)} TO {role}" for view in views()]


def statements(cfg: QwenSparkConfig) -> list[str]:
    """Every GRANT init-db runs for the roles the config names (none when it names none)."""
    out = job_grants(cfg, cfg.db.job_role) if cfg.db.job_role else []
    return out + (dashboard_grants(cfg, cfg.db.dashboard_role) if cfg.db.dashboard_role else [])


def apply(cfg: QwenSparkConfig) -> list[str]:
    """Run statements(cfg) as the schema owner (who holds these privileges WITH GRANT OPTION); returns them."""
    from qwenspark.io.mysql import connect

    done = statements(cfg)
    if done:
        with connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
            for sql in done:
                cur.execute(sql)
    return done
