"""sql/schema.sql holds the result tables to qwenspark.schemas (the one source of truth)."""

import re

from qwenspark.io.mysql import sql_text, statements
from qwenspark.schemas import RESULT_COLUMNS, STAGE_SCHEMA


def _columns(table: str) -> list[str]:
    for stmt in statements(sql_text("schema.sql")):
        if re.match(rf"CREATE TABLE IF NOT EXISTS {table}\s*\(", stmt):
            body = stmt.split("(", 1)[1]
            return [
                m.group(1)
                for line in body.splitlines()
                if (m := re.match(r"\s+([a-z_]+)\s+[A-Z]", line)) and m.group(1) not in {"KEY", "PRIMARY"}
            ]
    raise AssertionError(f"no DDL for {table}")


def test_result_table_matches_schema() -> None:
    assert _columns("review_sentiment") == [*RESULT_COLUMNS, "run_id"]


def test_stage_table_matches_schema() -> None:
    assert _columns("review_sentiment_stage") == STAGE_SCHEMA.fieldNames()


def test_statement_splitter_keeps_every_statement() -> None:
    script = "-- c\nCREATE TABLE a (x INT);\nINSERT INTO a VALUES (1);\n\n-- end\n"
    assert statements(script) == ["CREATE TABLE a (x INT)", "INSERT INTO a VALUES (1)"]
