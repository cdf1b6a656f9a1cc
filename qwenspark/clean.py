"""Clean stage (Spark side): strip invisible characters, flag rows with no content or unstorable ids, key each row."""

from __future__ import annotations

import math
import re
import unicodedata

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from qwenspark.config import QwenSparkConfig
from qwenspark.models.identity import model_identity
from qwenspark.schemas import CLEAN_SCHEMA, HOTEL_ID_MAX_CHARS, LANG_MAX_CHARS

# The patterns run in Java (java.util.regex), where \s is ASCII-only: Unicode's White_Space property covers
# U+2003, U+2028, U+205F, U+1680, U+3000 and the rest. The Hangul fillers and the blank Braille pattern are letters
# and symbols by category but render as nothing (a known way to post an "invisible" text): blanks here too.
_BLANK = r"\p{IsWhite_Space}\u115F\u1160\u3164\uFFA0\u2800"
# Control and format characters mean nothing to a reader and can hide text from one (bidi overrides, tag
# characters); \t and \n are layout and stay, ZWNJ/ZWJ stay inside text (they shape Indic and Persian script and
# join emoji sequences).
_INVISIBLE = r"[\p{Cc}\p{Cf}&&[^\t\n\u200C\u200D]]"
_EDGES = rf"^[{_BLANK}\u200C\u200D]+|[{_BLANK}\u200C\u200D]+$"
# Content: a letter or a digit in any script, or a symbol such as an emoji or a star ("👍👍" and "★★★★★" carry
# a verdict); punctuation, marks and blanks alone do not.
_CONTENT = r"[\p{L}\p{N}\p{So}&&[^\u115F\u1160\u3164\uFFA0\u2800]]"

# Error prefixes of results that depend only on the review's content (and the model and prompt its input_key
# names): a rerun would give the same error, so such a stored row is current. Any other error (an engine outage,
# a refusal under load) is analysed again by the next run.
CONTENT_ERROR_PREFIXES: tuple[str, ...] = ("empty:", "invalid:", "prompt:", "parse:")


def input_key(cfg: QwenSparkConfig, lang: Column, text: Column) -> Column:
    """sha256(model identity, prompt version, normalised lang, raw text): a stored result with the same key is
    current. The identity (models/identity.py) names the weights, not their path; it is computed here, on the
    driver, once per run."""
    parts = [model_identity(cfg.engine), cfg.prompt.version]
    return F.sha2(
        F.concat_ws("\u001f", *map(F.lit, parts), F.coalesce(lang, F.lit("")), F.coalesce(text, F.lit(""))), 256
    )


def visible_text(text: Column) -> Column:
    """text as valid UTF-8, CR/CRLF as \\n, without control and format characters, trimmed of Unicode blanks."""
    valid = F.make_valid_utf8(text)  # invalid bytes would fail Arrow's conversion of the whole batch
    lines = F.regexp_replace(valid, r"\r\n?", "\n")
    return F.regexp_replace(F.regexp_replace(lines, _INVISIBLE, ""), _EDGES, "")


def normal_lang(lang: Column) -> Column:
    """Trimmed, lower case; a tag longer than the result column becomes its primary subtag (zh-Hans-CN -> zh),
    NULL if even that does not fit or nothing is left (the executor then detects the language from the text)."""
    tag = F.lower(visible_text(lang))
    primary = F.split(tag, "[-_]", 2).getItem(0)
    return (
        F.when(F.length(tag) == 0, F.lit(None))
        .when(F.length(tag) <= LANG_MAX_CHARS, tag)
        .when(F.length(primary).between(1, LANG_MAX_CHARS), primary)
        .otherwise(F.lit(None))
        .cast("string")
    )


def clean(reviews: DataFrame, cfg: QwenSparkConfig) -> DataFrame:
    """Every row survives: rows the model must not see get clean_error (the executor skips them); text is capped."""
    text = visible_text(F.col("text"))
    # F.length counts characters, as VARCHAR(n) does: a longer hotel_id cannot be stored, so the row is an error
    # with hotel_id NULL (the aggregates skip NULL hotels) instead of a failed staging write.
    too_long_hotel = F.length(F.col("hotel_id")) > HOTEL_ID_MAX_CHARS
    error = (
        F.when(too_long_hotel, F.lit(f"invalid: hotel_id longer than {HOTEL_ID_MAX_CHARS} characters"))
        .when(F.col("text").isNull(), F.lit("empty: text is NULL"))
        .when(F.length(text) == 0, F.lit("empty: text is blank"))
        .when(~text.rlike(_CONTENT), F.lit("empty: no letters, digits or symbols"))
        .otherwise(F.lit(None).cast("string"))
    )
    # The token cap (and the truncated flag) is applied on the executor with the model's tokenizer;
    # this character cap only bounds what crosses Arrow and the tokenizer for pathological rows.
    return reviews.select(
        "review_id",
        F.when(too_long_hotel, F.lit(None)).otherwise(F.make_valid_utf8("hotel_id")).cast("string").alias("hotel_id"),
        "created_at",
        normal_lang(F.col("lang")).alias("lang"),
        F.substring(text, 1, cfg.clean.max_chars).alias("text"),
        input_key(cfg, normal_lang(F.col("lang")), F.col("text")).alias("input_key"),
        error.alias("clean_error"),
    ).select(*CLEAN_SCHEMA.fieldNames())


def skip_done(cleaned: DataFrame, done: DataFrame, cfg: QwenSparkConfig) -> DataFrame:
    """Drop rows whose stored result has the same input_key, hotel_id and created_at and is current: no error, or
    an error of the content (CONTENT_ERROR_PREFIXES) unless job.retry_errors. Any other stored error is analysed
    again. done: jdbc.read_done's columns."""
    if cfg.job.reprocess:
        return cleaned
    current = F.col("error").isNull()
    if not cfg.job.retry_errors:
        for prefix in CONTENT_ERROR_PREFIXES:
            current |= F.col("error").startswith(prefix)
    stored = done.where(current).select(
        F.col("review_id").alias("done_id"), F.col("input_key").alias("done_key"),
        F.col("hotel_id").alias("done_hotel"), F.col("review_created_at").alias("done_created"),
    )
    # A review edited into another hotel or day (same text) is not current: its result, and its share of the
    # aggregates, belong to the old key until it is written again.
    same = (
        (cleaned["review_id"] == stored["done_id"])
        & (cleaned["input_key"] == stored["done_key"])
        & cleaned["hotel_id"].eqNullSafe(stored["done_hotel"])
        & cleaned["created_at"].eqNullSafe(stored["done_created"])
    )
    return cleaned.join(stored, same, "left_anti")


# The same rules in Python, for text the API's column function gets from any query (qwenspark.api): Unicode's
# White_Space property and the blanks above, the Cc/Cf categories, content as letters, digits or symbols (So).
_WHITE_SPACE = frozenset(
    "\t\n\v\f\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
)
_BLANKS = _WHITE_SPACE | frozenset("\u115f\u1160\u3164\uffa0\u2800")
_EDGE_CHARS = "".join(_BLANKS | {"\u200c", "\u200d"})
_KEPT_FORMAT = frozenset("\t\n\u200c\u200d")


def clean_text(text: object, max_chars: int) -> tuple[str, str | None]:
    """What clean() makes of one text, in Python: the visible text capped at max_chars, and its clean_error."""
    if text is None or (isinstance(text, float) and math.isnan(text)):  # NULL (pandas may hand it as NaN)
        return "", "empty: text is NULL"
    raw = text if isinstance(text, str) else str(text)
    lines = raw.replace("\r\n", "\n").replace("\r", "\n")
    visible = "".join(c for c in lines if c in _KEPT_FORMAT or unicodedata.category(c) not in ("Cc", "Cf"))
    visible = visible.strip(_EDGE_CHARS)
    if not visible:
        return "", "empty: text is blank"
    if not any(c not in _BLANKS and (unicodedata.category(c)[0] in "LN" or unicodedata.category(c) == "So")
               for c in visible):
        return visible[:max_chars], "empty: no letters, digits or symbols"
    return visible[:max_chars], None


def clean_lang(lang: object) -> str | None:
    """What normal_lang() makes of one language tag, in Python."""
    if not isinstance(lang, str):
        return None
    tag = clean_text(lang, max(1, len(lang)))[0].lower()
    if len(tag) <= LANG_MAX_CHARS:
        return tag or None
    primary = re.split("[-_]", tag, maxsplit=1)[0]
    return primary if 1 <= len(primary) <= LANG_MAX_CHARS else None
