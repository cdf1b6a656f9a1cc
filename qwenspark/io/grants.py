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

# Every table the jobs write. A migration that adds one adds it here, so preflight tests it and init-db grants it.
RESULT_TABLES = (
    "review_sentiment",
    "review_sentiment_stage",
    "job_runs",
    "hotel_sentiment_daily",
    "aspect_sentiment",
    "stream_commits",
    "stream_rejects",
)
# What the jobs do to every result table (upserts, bookkeeping, dropping staged rows).
RESULT_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
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
    grants += [f"GRANT {', '.join(RESULT_PRIVILEGES)} ON {db}.{_q(table)} TO {role}" for table in RESULT_TABLES]
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
