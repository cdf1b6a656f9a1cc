"""Completion text -> validated ReviewAnalysis, or an error string for the row's error column."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from qwenspark.schemas import ReviewAnalysis

_ERR_MAX = 500
# The error of an answer cut by max_tokens (the eval counts these as cut).
CUT_ERROR = "parse: output hit max_tokens before the JSON ended"


@dataclass(frozen=True)
class Parsed:
    """Either a record or an error, never both."""

    record: ReviewAnalysis | None
    error: str | None


AnswerOrder = Literal["verdict_first", "verdict_last"]
# The order guided decoding writes the answer's fields in. A causal model conditions each field on those before
# it: verdict_last makes it name the aspects and summarise the stay before it decides the label, which a label
# sentence injected into the review sways far less (bench/injection.py).
ANSWER_FIELDS: dict[str, tuple[str, ...]] = {
    "verdict_first": ("sentiment", "summary", "aspects"),
    "verdict_last": ("aspects", "summary", "sentiment"),
}


def json_schema(order: AnswerOrder = "verdict_first", summary_max_chars: int | None = None) -> dict[str, Any]:
    """The JSON schema handed to guided decoding, its properties in `order` (strings carry maxLength so decoding
    always ends; summary_max_chars tightens the summary's, as a prompt version asks)."""
    schema = ReviewAnalysis.model_json_schema()
    fields = ANSWER_FIELDS[order]
    schema["properties"] = {name: dict(schema["properties"][name]) for name in fields}
    if summary_max_chars is not None:
        summary = schema["properties"]["summary"]
        summary["maxLength"] = min(summary["maxLength"], summary_max_chars)
    schema["required"] = list(fields)
    return schema


def parse_completion(text: str, finish_reason: str | None = None) -> Parsed:
    """Validate one completion. A cut-off output is reported as such, not as a JSON error.

    finish_reason "error: <reason>" marks a row the engine refused for its content (engines/openai.py: HTTP
    400/413/422 or a malformed answer); outages raise EngineError instead and fail the task.
    """
    if finish_reason and finish_reason.startswith("error:"):
        return Parsed(None, "engine: " + finish_reason[len("error: ") :])
    if finish_reason == "length":
        return Parsed(None, f"{CUT_ERROR}: {text[:_ERR_MAX]!r}")
    stripped = text.strip()
    # Unguided models sometimes wrap JSON in a markdown fence; guided ones never do.
    if stripped.startswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError as exc:
        return Parsed(None, f"parse: not JSON ({exc.msg} at {exc.pos}): {text[:_ERR_MAX]!r}")
    try:
        record = ReviewAnalysis.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return Parsed(None, f"parse: schema: {problems}"[:_ERR_MAX])
    return Parsed(_dedupe_aspects(record), None)


def _dedupe_aspects(record: ReviewAnalysis) -> ReviewAnalysis:
    # A small model may name an aspect twice; keep the first mention so aggregates count it once.
    seen: set[str] = set()
    kept = []
    for mention in record.aspects:
        if mention.aspect not in seen:
            seen.add(mention.aspect)
            kept.append(mention)
    return record if len(kept) == len(record.aspects) else record.model_copy(update={"aspects": kept})


def aspects_json(record: ReviewAnalysis) -> str:
    """The aspects as the compact JSON array stored in review_sentiment.aspects."""
    return json.dumps([m.model_dump() for m in record.aspects], ensure_ascii=False, separators=(",", ":"))
