"""Spark schemas of the data flow and the analysis record: the one source of truth (tests hold sql/ to it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SENTIMENTS: tuple[str, ...] = ("positive", "negative", "neutral", "mixed")
ASPECT_SENTIMENTS: tuple[str, ...] = ("positive", "negative", "neutral")
ASPECTS: tuple[str, ...] = (
    "room",
    "service",
    "location",
    "cleanliness",
    "breakfast/food",
    "price/value",
    "facilities",
    "noise",
)
SUMMARY_MAX_CHARS = 200
MAX_ASPECTS = len(ASPECTS)
# Widths of the result columns a source value is copied into (sql/schema.sql: VARCHAR(64), VARCHAR(8)).
HOTEL_ID_MAX_CHARS = 64
LANG_MAX_CHARS = 8

Sentiment = Literal["positive", "negative", "neutral", "mixed"]
AspectName = Literal[
    "room", "service", "location", "cleanliness", "breakfast/food", "price/value", "facilities", "noise"
]
AspectSentiment = Literal["positive", "negative", "neutral"]


class AspectMention(BaseModel):
    """One aspect of the stay and how the reviewer felt about it."""

    model_config = ConfigDict(extra="forbid")
    aspect: AspectName
    sentiment: AspectSentiment


class ReviewAnalysis(BaseModel):
    """What the model must return for one review; its JSON schema drives guided decoding."""

    model_config = ConfigDict(extra="forbid")
    # Sentiment first: the label is decided before the free text, which helps small models stay on task.
    sentiment: Sentiment
    summary: str = Field(min_length=1, max_length=SUMMARY_MAX_CHARS)
    aspects: list[AspectMention] = Field(max_length=MAX_ASPECTS)


# Reviews as read from MySQL (hotel_reviews). lang and rating may be NULL in real feeds.
INPUT_SCHEMA = StructType(
    [
        StructField("review_id", LongType(), False),
        StructField("hotel_id", StringType(), True),
        StructField("created_at", TimestampType(), True),
        StructField("lang", StringType(), True),
        StructField("rating", IntegerType(), True),
        StructField("text", StringType(), True),
    ]
)

# What clean() hands to the executor: text trimmed and char-capped, empty flagged, input_key computed.
CLEAN_SCHEMA = StructType(
    [
        StructField("review_id", LongType(), False),
        StructField("hotel_id", StringType(), True),
        StructField("created_at", TimestampType(), True),
        StructField("lang", StringType(), True),
        StructField("text", StringType(), True),
        StructField("input_key", StringType(), False),
        StructField("clean_error", StringType(), True),
    ]
)

# One row per input row out of mapInPandas: results, or an error text; never both empty.
RESULT_SCHEMA = StructType(
    [
        StructField("review_id", LongType(), False),
        StructField("hotel_id", StringType(), True),
        StructField("review_created_at", TimestampType(), True),
        StructField("lang", StringType(), True),
        StructField("input_key", StringType(), False),
        StructField("sentiment", StringType(), True),
        StructField("summary", StringType(), True),
        StructField("aspects", StringType(), True),  # JSON array of {aspect, sentiment}
        StructField("truncated", BooleanType(), False),
        StructField("error", StringType(), True),
        StructField("model", StringType(), False),
        StructField("prompt_version", StringType(), False),
        StructField("tokens_in", IntegerType(), False),
        StructField("tokens_out", IntegerType(), False),
        StructField("latency_ms", IntegerType(), False),
        StructField("analysed_at", TimestampType(), False),
    ]
)

# Timestamps cross Arrow as microseconds since the epoch (LongType), never as timestamps: pandas holds datetime64[ns],
# which ends in 2262 and begins in 1677, while a MySQL DATETIME runs from 1000 to 9999 (one row out of that range
# failed the whole batch). A NULL travels as NULL_MICROS, because pandas turns a nullable int64 column into float64,
# whose 53 bits lose microseconds past 2255; no timestamp Spark can hold (years 1-9999) is that far from 1970.
NULL_MICROS = -(2**63)
MICROS_COLUMNS_IN: tuple[str, ...] = ("created_at",)
MICROS_COLUMNS_OUT: tuple[str, ...] = ("review_created_at", "analysed_at")


def _as_micros(schema: StructType, names: tuple[str, ...]) -> StructType:
    return StructType([StructField(f.name, LongType(), False) if f.name in names else f for f in schema.fields])


# What the executor (analyze.make_analyze_fn) gets and returns through mapInPandas: CLEAN_SCHEMA and RESULT_SCHEMA
# with their timestamps as microseconds (qwenspark.pipeline.analyse converts on both sides).
EXECUTOR_IN_SCHEMA = _as_micros(CLEAN_SCHEMA, MICROS_COLUMNS_IN)
EXECUTOR_OUT_SCHEMA = _as_micros(RESULT_SCHEMA, MICROS_COLUMNS_OUT)


def to_executor(cleaned: DataFrame) -> DataFrame:
    """CLEAN_SCHEMA rows as EXECUTOR_IN_SCHEMA: timestamps as exact microseconds, NULL as NULL_MICROS."""
    return cleaned.select(
        *(_to_micros(f.name) if f.name in MICROS_COLUMNS_IN else F.col(f.name) for f in CLEAN_SCHEMA.fields)
    )


def from_executor(results: DataFrame) -> DataFrame:
    """EXECUTOR_OUT_SCHEMA rows as RESULT_SCHEMA: the microseconds back as the same timestamps."""
    return results.select(
        *(_from_micros(f.name) if f.name in MICROS_COLUMNS_OUT else F.col(f.name) for f in RESULT_SCHEMA.fields)
    )


def _to_micros(name: str) -> Column:
    return F.coalesce(F.unix_micros(F.col(name)), F.lit(NULL_MICROS)).alias(name)


def _from_micros(name: str) -> Column:
    micros = F.col(name)
    return F.when(micros.isNull() | (micros == NULL_MICROS), F.lit(None)).otherwise(F.timestamp_micros(micros)).alias(
        name
    )

# The staging table adds the run that wrote the row (see sql/schema.sql).
STAGE_SCHEMA = StructType([StructField("run_id", StringType(), False), *RESULT_SCHEMA.fields])

RESULT_COLUMNS: tuple[str, ...] = tuple(RESULT_SCHEMA.fieldNames())
