"""Spark schemas of the data flow and the analysis record: the one source of truth (tests hold sql/ to it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
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

# The staging table adds the run that wrote the row (see sql/schema.sql).
STAGE_SCHEMA = StructType([StructField("run_id", StringType(), False), *RESULT_SCHEMA.fields])

RESULT_COLUMNS: tuple[str, ...] = tuple(RESULT_SCHEMA.fieldNames())
