"""sql/schema.sql holds the result tables to qwenspark.schemas (the one source of truth)."""

import re

from qwenspark.io.mysql import script_sections, sql_text, statements
from qwenspark.schemas import RESULT_COLUMNS, STAGE_SCHEMA


def _ddl(table: str) -> str:
    for stmt in statements(sql_text("schema.sql")):
        if re.match(rf"CREATE TABLE IF NOT EXISTS {table}\s*\(", stmt):
            return stmt
    raise AssertionError(f"no DDL for {table}")


def _columns(table: str) -> list[str]:
    body = _ddl(table).split("(", 1)[1]
    return [
        m.group(1)
        for line in body.splitlines()
        if (m := re.match(r"\s+([a-z_]+)\s+[A-Z]", line)) and m.group(1) not in {"KEY", "PRIMARY"}
    ]


def test_result_table_matches_schema() -> None:
    assert _columns("review_sentiment") == [*RESULT_COLUMNS, "run_id"]


def test_stage_table_matches_schema() -> None:
    # stage_seq is no result column: it numbers staged copies (Spark inserts only STAGE_SCHEMA's columns).
    assert _columns("review_sentiment_stage") == [*STAGE_SCHEMA.fieldNames(), "stage_seq"]


def test_stage_table_accepts_a_review_twice() -> None:
    # A Spark write task retried after a partial write stages some reviews again: no unique (run_id, review_id).
    ddl = _ddl("review_sentiment_stage")
    assert re.search(r"PRIMARY KEY \(run_id, review_id, stage_seq\)", ddl)
    assert "UNIQUE" not in ddl.upper()
    assert re.search(r"stage_seq\s+BIGINT UNSIGNED NOT NULL DEFAULT \(UUID_SHORT\(\)\)", ddl)


def test_upsert_script_sections() -> None:
    sections = script_sections(sql_text("upsert.sql"))
    assert list(sections) == ["delta_tables", "changes", "deltas", "old", "upsert", "apply", "spent"]
    assert all(sections.values())
    # The purge reuses @delta_tables, @old and @apply: the temporary tables live in a section of their own.
    assert all(stmt.startswith(("DROP TEMPORARY TABLE", "CREATE TEMPORARY TABLE")) for stmt in sections["delta_tables"])
    assert not any("TEMPORARY" in stmt for stmt in sections["deltas"])


def test_recompute_script_sections() -> None:
    # One section per migration's aggregates: v002 recomputes its two tables before v006 and v007 have made the
    # others; the whole script (tests, a repair by hand) recomputes all six.
    script = sql_text("recompute_aggregates.sql")
    sections = script_sections(script)
    assert list(sections) == ["by_hotel", "by_lang", "by_month"]
    assert [s for stmts in sections.values() for s in stmts] == statements(script)
    tables = {name: [re.match(r"(?:DELETE FROM|INSERT INTO) (\w+)", s).group(1) for s in stmts]  # type: ignore[union-attr]
              for name, stmts in sections.items()}
    assert tables == {"by_hotel": ["hotel_sentiment_daily"] * 2 + ["aspect_sentiment"] * 2,
                      "by_lang": ["sentiment_daily_lang"] * 2 + ["aspect_daily_lang"] * 2,
                      "by_month": ["sentiment_monthly_lang"] * 2 + ["aspect_monthly_lang"] * 2}


def test_purge_script_sections() -> None:
    sections = script_sections(sql_text("purge.sql"))
    assert list(sections) == ["select", "delete"]
    assert all("{source}" in stmt for stmt in sections["select"])


def test_statement_splitter_keeps_every_statement() -> None:
    script = "-- c\nCREATE TABLE a (x INT);\nINSERT INTO a VALUES (1);\n\n-- end\n"
    assert statements(script) == ["CREATE TABLE a (x INT)", "INSERT INTO a VALUES (1)"]
