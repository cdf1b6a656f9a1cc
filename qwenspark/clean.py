"""Clean stage (Spark side): trim, cap by characters, flag empty text, key each row by what produced it."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from qwenspark.config import QwenSparkConfig
from qwenspark.schemas import CLEAN_SCHEMA

# Unicode whitespace incl. the ideographic space U+3000 that Chinese text uses.
_EDGE_SPACE = r"^[\s\u3000\u00a0\u200b\ufeff]+|[\s\u3000\u00a0\u200b\ufeff]+$"


def input_key(cfg: QwenSparkConfig, text: Column) -> Column:
    """sha256(model, prompt version, raw text): a stored result with the same key is still current."""
    return F.sha2(
        F.concat_ws("\u001f", F.lit(cfg.engine.model), F.lit(cfg.prompt.version), F.coalesce(text, F.lit(""))), 256
    )


def clean(reviews: DataFrame, cfg: QwenSparkConfig) -> DataFrame:
    """Every row survives: empty text gets clean_error (the engine skips it), long text is capped."""
    trimmed = F.regexp_replace(F.col("text"), _EDGE_SPACE, "")
    error = (
        F.when(F.col("text").isNull(), F.lit("empty: text is NULL"))
        .when(F.length(trimmed) == 0, F.lit("empty: text is blank"))
        .otherwise(F.lit(None).cast("string"))
    )
    # The token cap (and the truncated flag) is applied on the executor with the model's tokenizer;
    # this character cap only bounds what crosses Arrow and the tokenizer for pathological rows.
    return reviews.select(
        "review_id",
        "hotel_id",
        "created_at",
        "lang",
        F.substring(trimmed, 1, cfg.clean.max_chars).alias("text"),
        input_key(cfg, F.col("text")).alias("input_key"),
        error.alias("clean_error"),
    ).select(*CLEAN_SCHEMA.fieldNames())


def skip_done(cleaned: DataFrame, done: DataFrame, cfg: QwenSparkConfig) -> DataFrame:
    """Drop rows whose stored result has the same input_key (and no error, unless errors are kept)."""
    if cfg.job.reprocess:
        return cleaned
    current = done
    if cfg.job.retry_errors:
        current = current.where(F.col("error").isNull())
    return cleaned.join(current.select("review_id", "input_key"), ["review_id", "input_key"], "left_anti")
