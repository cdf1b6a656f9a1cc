"""Completion text -> validated ReviewAnalysis, or an error string for the row's error column."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from qwenspark.aspect_evidence import evidenced
from qwenspark.schemas import ASPECT_SENTIMENTS, ASPECTS, SENTIMENTS, SUMMARY_MAX_CHARS, ReviewAnalysis

if TYPE_CHECKING:
    from qwenspark.config import EngineConfig

_ERR_MAX = 500
# The degenerate loops of a small model: a unit of 1-3 characters 8 times or more in a row ("？？？？？？？？"), or
# one of 4-20 characters 5 times or more ("good good good good good ").
_LOOP = re.compile(r"(.{1,3}?)\1{7,}|(.{4,20}?)\2{4,}", re.DOTALL)
# The error of an answer cut by max_tokens (the eval counts these as cut).
CUT_ERROR = "parse: output hit max_tokens before the JSON ended"
# A prompt version's bound on the summary in characters (engine.summary_max_chars): one for every language, or one by
# language (its "en" entry for a language it does not name); None: the schema's SUMMARY_MAX_CHARS.
SummaryBound = int | Mapping[str, int] | None


def summary_chars(bound: SummaryBound, lang: str | None) -> int | None:
    """bound's characters for a summary of a review in lang."""
    if bound is None or isinstance(bound, int):
        return bound
    return bound.get(lang or "en", bound["en"])


@dataclass(frozen=True)
class Parsed:
    """Either a record or an error, never both."""

    record: ReviewAnalysis | None
    error: str | None


AnswerOrder = Literal["verdict_first", "verdict_last"]
# What the engine writes (engine.answer_format, from the prompt version): "json", the answer as one JSON object; or
# "lines" (v13), three lines that hold the same record in about a quarter fewer tokens (no keys or braces):
#   negative
#   "Overpriced, smelly room, cold breakfast; only the location is good."
#   room:negative location:positive breakfast/food:negative
# the label, the summary in double quotes (lines_grammar says why), then the aspects (the line may be empty).
# parse_completion reads either into the same record, stored as before.
AnswerFormat = Literal["json", "lines"]
# The order guided decoding writes the answer's fields in. A causal model conditions each field on those before
# it: verdict_last makes it name the aspects and summarise the stay before it decides the label, which a label
# sentence injected into the review sways far less (bench/injection.py).
ANSWER_FIELDS: dict[str, tuple[str, ...]] = {
    "verdict_first": ("sentiment", "summary", "aspects"),
    "verdict_last": ("aspects", "summary", "sentiment"),
}


# Per review language, the characters a summary may be written in (prompt versions with summary_script): the
# grammar then writes every summary in its review's language (the 0.5B wrote English for 1 Chinese review in 8).
# zh: a Han character first and no Latin letter at all (a brand such as WiFi is written in Chinese); en: a Latin
# letter first and no CJK character or CJK punctuation. Outside the character classes: the JSON string's quote,
# backslash and control characters, so the pattern's text is always a valid JSON string as written.
_HAN = "\\u3400-\\u4dbf\\u4e00-\\u9fff\\uf900-\\ufaff"
_NOT_JSON = '"\\\\\\x00-\\x1f'
SUMMARY_SCRIPTS: dict[str, tuple[str, str]] = {  # lang -> (first character, the characters after it)
    "zh": (f"[{_HAN}]", f"[^A-Za-z{_NOT_JSON}]"),
    "en": ("[A-Za-z]", f"[^{_HAN}\\u3000-\\u303f\\uff00-\\uffef{_NOT_JSON}]"),
}


# The aspects as one object, aspect -> sentiment, its keys in ASPECTS order (prompt versions with aspect_map): about
# 5 tokens an aspect instead of 10 for {"aspect":...,"sentiment":...}, and no aspect twice. parse_completion turns it
# back into the stored list.
ASPECT_MAP_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {name: {"enum": list(ASPECT_SENTIMENTS)} for name in ASPECTS},
    "additionalProperties": False,
}


def json_schema(order: AnswerOrder = "verdict_first", summary_max_chars: SummaryBound = None,
                summary_lang: str | None = None, aspect_map: bool = False,
                labels: tuple[str, ...] = SENTIMENTS) -> dict[str, Any]:
    """The JSON schema handed to guided decoding, its properties in `order` (strings carry maxLength so decoding
    always ends; summary_max_chars tightens the summary's, as a prompt version asks). With summary_lang one of
    SUMMARY_SCRIPTS, the summary must be written in that language's script (a pattern that carries the bound);
    with aspect_map the aspects are ASPECT_MAP_SCHEMA's object; labels: the sentiments allowed (a pinned retry)."""
    schema = ReviewAnalysis.model_json_schema()
    fields = ANSWER_FIELDS[order]
    schema["properties"] = {name: dict(schema["properties"][name]) for name in fields}
    schema["properties"]["sentiment"]["enum"] = list(labels)
    if aspect_map:
        schema["properties"]["aspects"] = ASPECT_MAP_SCHEMA
        schema.pop("$defs", None)
    summary = schema["properties"]["summary"]
    bound = summary_chars(summary_max_chars, summary_lang)
    if bound is not None:
        summary["maxLength"] = min(summary["maxLength"], bound)
    if summary_lang in SUMMARY_SCRIPTS:
        first, rest = SUMMARY_SCRIPTS[summary_lang]
        # xgrammar ignores maxLength beside a pattern: the pattern bounds the length itself.
        summary["pattern"] = f"^{first}{rest}{{0,{summary.pop('maxLength') - 1}}}$"
        summary.pop("minLength", None)
    schema["required"] = list(fields)
    return schema


_ASPECT_ITEM = f"({'|'.join(re.escape(a) for a in ASPECTS)}):({'|'.join(ASPECT_SENTIMENTS)})"


def _alternatives(words: tuple[str, ...]) -> str:
    return "(" + " | ".join(json.dumps(w) for w in words) + ")"


def _summary_bound(summary_max_chars: SummaryBound, lang: str | None) -> int:
    """The summary's bound in characters for a review in lang: a version's summary_max_chars, never above the
    schema's SUMMARY_MAX_CHARS."""
    return min(SUMMARY_MAX_CHARS, summary_chars(summary_max_chars, lang) or SUMMARY_MAX_CHARS)


def lines_grammar(summary_max_chars: SummaryBound = None, summary_lang: str | None = None,
                  labels: tuple[str, ...] = SENTIMENTS) -> str:
    """The grammar (xgrammar EBNF) handed to guided decoding for answers in lines: a label (one of labels), a quoted
    summary of at most summary_max_chars (in its language's script with summary_lang, SUMMARY_SCRIPTS), then up to one
    aspect:sentiment item per aspect, separated by single spaces. Bounded everywhere, so decoding always ends.

    Why EBNF and quotes: the summary's bounded repetition as a plain regular expression, or ended by the newline,
    cost xgrammar 280-480 us of mask work per token (the tokenizer has thousands of tokens holding a newline, each
    checked against what follows); as a Regex node ended by a quote, as inside JSON, 21-25 us, about v10's JSON schema
    (bench/device/check_lines_grammar.py)."""
    first, rest = SUMMARY_SCRIPTS.get(summary_lang or "", (f"[^ {_NOT_JSON}]", f"[^{_NOT_JSON}]"))
    bound = _summary_bound(summary_max_chars, summary_lang)
    item = f'{_alternatives(ASPECTS)} ":" {_alternatives(ASPECT_SENTIMENTS)}'
    return "\n".join([
        f'root ::= {_alternatives(labels)} "\\n\\"" summary "\\"\\n" aspects',
        f'summary ::= Regex({json.dumps(f"^{first}{rest}{{0,{bound - 1}}}$")}) (="\\"")',
        f'aspects ::= (item (" " item){{0,{len(ASPECTS) - 1}}})?',
        f"item ::= {item}",
    ])


def answer_grammars(cfg: EngineConfig, label: str | None = None) -> dict[str | None, dict[str, Any]]:
    """The guided grammars an engine needs for its answer settings (set from the prompt version), by review language:
    None for any language, plus one per SUMMARY_SCRIPTS language when engine.summary_script is set. Each is
    {"json": schema} or, for answers in lines, {"grammar": ebnf}: the keywords of vLLM's StructuredOutputsParams.
    label: the answer's sentiment pinned to it (the service's retry of an answer whose label it has sent)."""
    langs: tuple[str | None, ...] = (None, *SUMMARY_SCRIPTS) if cfg.summary_script else (None,)
    labels = SENTIMENTS if label is None else (label,)
    if cfg.answer_format == "lines":
        return {lang: {"grammar": lines_grammar(cfg.summary_max_chars, lang, labels)} for lang in langs}
    return {lang: {"json": json_schema(cfg.answer_order, cfg.summary_max_chars, lang, cfg.aspect_map, labels)}
            for lang in langs}


# vLLM's finish reason for an answer its engine ended in an error: on an H100 (stop 52) one engine at 200 guided
# requests/s ended 0.2-2 % of answers so, its sampler having picked a token the answer's grammar refuses ("grammar
# rejected tokens [0]", vLLM 0.26, its own mask fill or the batch matcher alike; vllm-project/vllm#53181 reports it
# after the fix of 0.27). Not the model's answer: generated again (analyze.PreparedBatch's "fault" retries).
ENGINE_FAULT = "error"


def parse_completion(text: str, finish_reason: str | None = None, aspect_map: bool = False,
                     answer_format: AnswerFormat = "json") -> Parsed:
    """Validate one completion. A cut-off output is reported as such, not as a JSON error. aspect_map: the answer's
    aspects are an object (ASPECT_MAP_SCHEMA), read into the stored list in its order; answer_format "lines": the
    answer is in lines (AnswerFormat).

    finish_reason "error: <reason>" marks a row the engine refused for its content (engines/openai.py: HTTP
    400/413/422 or a malformed answer), "error" (ENGINE_FAULT) an answer the engine ended in an error; outages raise
    EngineError instead and fail the task.
    """
    if finish_reason and finish_reason.startswith("error:"):
        return Parsed(None, "engine: " + finish_reason[len("error: ") :])
    if finish_reason == ENGINE_FAULT:
        return Parsed(None, f"engine: the answer ended in an engine error (finish_reason 'error', e.g. a token its "
                            f"grammar refused): {text[:_ERR_MAX]!r}")
    if finish_reason == "length":
        return Parsed(None, f"{CUT_ERROR}: {text[:_ERR_MAX]!r}")
    if answer_format == "lines":
        return _validated(*_read_lines(text))
    stripped = text.strip()
    # Unguided models sometimes wrap JSON in a markdown fence; guided ones never do.
    if stripped.startswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError as exc:
        return Parsed(None, f"parse: not JSON ({exc.msg} at {exc.pos}): {text[:_ERR_MAX]!r}")
    if aspect_map and isinstance(data, dict):
        aspects = data.get("aspects")
        if not isinstance(aspects, dict):
            return Parsed(None, f"parse: schema: aspects: not an object of aspect -> sentiment: {text[:_ERR_MAX]!r}")
        data = {**data, "aspects": [{"aspect": name, "sentiment": feeling} for name, feeling in aspects.items()]}
    return _validated(data, None)


# An item of an answer's aspect line that names an aspect outside ASPECTS ("parking:positive", "transportation"), or
# one of ASPECTS without a sentiment ("noise"). Only an answer written without the grammar has them (a 1.5B wrote one
# in 14 of 40 v13 answers): they are left out of the record, as the grammar would have left them out, and the label
# and summary kept, instead of generating the whole answer again. Anything else on the line is an error.
_OTHER_ASPECT = re.compile(r"[a-z][a-z_/-]{0,31}(:[a-z]{1,16})?")


def _read_lines(text: str) -> tuple[Any, str | None]:
    """An answer in lines (AnswerFormat) as the record's fields, or the reason it is not one."""
    lines = [line.strip() for line in text.strip().split("\n")]
    if len(lines) == 2:  # no aspect named: the last line is empty
        lines.append("")
    if len(lines) != 3 or lines[0] not in SENTIMENTS:
        return None, f"parse: not three lines (label, summary, aspects): {text[:_ERR_MAX]!r}"
    items = lines[2].split()
    if len(items) > len(ASPECTS):  # the grammar's bound: more is a loop or prose, not a list of aspects
        return None, f"parse: aspects: {len(items)} items, at most {len(ASPECTS)}: {text[:_ERR_MAX]!r}"
    aspects = []
    for item in items:
        if not _readable_item(item):
            return None, f"parse: aspects: {item[:64]!r} is not aspect:sentiment: {text[:_ERR_MAX]!r}"
        name, _, feeling = item.partition(":")
        if name in ASPECTS and feeling in ASPECT_SENTIMENTS:
            aspects.append({"aspect": name, "sentiment": feeling})
    return {"sentiment": lines[0], "summary": _unquoted(lines[1]), "aspects": aspects}, None


def _readable_item(item: str) -> bool:
    """An item of the aspect line that _read_lines reads: one of ASPECTS with its sentiment, or one it leaves out."""
    name, _, feeling = item.partition(":")
    return (name in ASPECTS and feeling in ASPECT_SENTIMENTS) or _OTHER_ASPECT.fullmatch(item) is not None


def _unquoted(summary: str) -> str:
    """The summary line without the grammar's quotes (unguided answers may lack them)."""
    return summary[1:-1] if len(summary) >= 2 and summary[0] == summary[-1] == '"' else summary


# An aspect item being written: a prefix of one _OTHER_ASPECT would read (every name in ASPECTS is such a word).
_ASPECT_PREFIX = re.compile(r"[a-z][a-z_/-]{0,31}(:[a-z]{0,16})?")


# Whitespace an unguided answer in lines may begin with before it is dropped (lines_viable): the grammar's answers
# begin with their label at once.
LEADING_BLANKS = 8


def lines_viable(text: str, lang: str | None, summary_max_chars: SummaryBound = None,
                 summary_script: bool = False) -> bool:
    """Whether an answer in lines written without the grammar (engine.optimistic) can still end as one that fits:
    one parse_completion reads and grammar_misfit passes. False only when no continuation of text can, so the
    attempt may be dropped there and the grammar's retry started (the rest of the answer would be wasted): a first
    line that is no label, a summary past its bound or out of its script, an aspect item that is no word, more items
    than ASPECTS, a fourth line. One exception: more than LEADING_BLANKS whitespace characters before the label, which
    the parser would still read past but the grammar allows none of, end the attempt too (a weak model's loop: the
    random test model writes only newlines, to max_tokens)."""
    answer = text.lstrip()
    if len(text) - len(answer) > LEADING_BLANKS:
        return False
    lines = answer.split("\n")
    if len(lines) == 1:
        return any(label.startswith(lines[0].rstrip()) for label in SENTIMENTS)
    if lines[0].strip() not in SENTIMENTS:
        return False
    if not _summary_viable(lines[1].strip(), len(lines) > 2, lang, summary_max_chars, summary_script):
        return False
    if len(lines) > 2 and not _aspects_viable(lines[2], len(lines) > 3):
        return False
    return not any(line.strip() for line in lines[3:])


def _summary_viable(raw: str, whole: bool, lang: str | None, summary_max_chars: SummaryBound,
                    summary_script: bool) -> bool:
    """lines_viable's summary line (raw: stripped; whole: its line has ended)."""
    if whole:
        summary = _unquoted(raw)
        return 0 < len(summary) <= SUMMARY_MAX_CHARS and \
            _summary_misfit(summary, lang, summary_max_chars, summary_script) is None
    # Still being written: its opening quote may yet be taken off, and its last character, a quote, may be the
    # closing one; every other character stays in the summary.
    body = raw[1:] if raw.startswith('"') else raw
    inner = body[:-1] if body.endswith('"') else body
    if len(inner) > _summary_bound(summary_max_chars, lang):
        return False
    if not (summary_script and lang in SUMMARY_SCRIPTS) or not body:
        return True
    first, rest = SUMMARY_SCRIPTS[lang]
    return re.match(first, body) is not None and re.fullmatch(f"{rest}*", inner[1:]) is not None


def _aspects_viable(raw: str, whole: bool) -> bool:
    """lines_viable's aspects line (whole: its line has ended)."""
    items = raw.split()
    if len(items) > len(ASPECTS):
        return False
    written = items if whole or raw[-1:].isspace() else items[:-1]
    if not all(_readable_item(item) for item in written):
        return False
    return len(written) == len(items) or _ASPECT_PREFIX.fullmatch(items[-1]) is not None


def _validated(data: Any, error: str | None) -> Parsed:
    """The record of the answer's fields, or the error (the reading's, or the schema's)."""
    if error is not None:
        return Parsed(None, error)
    try:
        record = ReviewAnalysis.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return Parsed(None, f"parse: schema: {problems}"[:_ERR_MAX])
    return Parsed(_dedupe_aspects(record), None)


def looping(text: str | None) -> bool:
    """True when the text holds a degenerate repetition (_LOOP)."""
    return bool(text) and _LOOP.search(text or "") is not None


def grammar_misfit(
    record: ReviewAnalysis, lang: str, summary_max_chars: SummaryBound, summary_script: bool
) -> str | None:
    """What an answer written without the grammar (engine.optimistic) breaks of the grammar's rules that the record's
    own validation leaves out: the summary's bound and its script (SUMMARY_SCRIPTS); None when it fits."""
    return _summary_misfit(record.summary, lang, summary_max_chars, summary_script)


def _summary_misfit(summary: str, lang: str | None, summary_max_chars: SummaryBound,
                    summary_script: bool) -> str | None:
    """grammar_misfit's rules, on a summary."""
    bound = summary_chars(summary_max_chars, lang)
    if bound is not None and len(summary) > bound:
        return f"summary over {bound} characters"
    if summary_script and lang in SUMMARY_SCRIPTS:
        first, rest = SUMMARY_SCRIPTS[lang]
        if re.fullmatch(f"{first}{rest}*", summary) is None:
            return f"summary not in the {lang} script"
    return None


def needs_repair(finish_reason: str | None, parsed: Parsed) -> bool:
    """Whether an answer is one to generate again with the repair settings (engine.repair_penalty): cut by
    max_tokens, or a summary stuck in a loop. Errors of other kinds are not retried: the same prompt would fail the
    same way."""
    if finish_reason == "length":
        return True
    return parsed.record is not None and looping(parsed.record.summary)


def _dedupe_aspects(record: ReviewAnalysis) -> ReviewAnalysis:
    # A small model may name an aspect twice; keep the first mention so aggregates count it once.
    seen: set[str] = set()
    kept = []
    for mention in record.aspects:
        if mention.aspect not in seen:
            seen.add(mention.aspect)
            kept.append(mention)
    return record if len(kept) == len(record.aspects) else record.model_copy(update={"aspects": kept})


# Where a summary stopped at its bound may be ended: after a clause (English and Chinese punctuation), else at a word.
_CLAUSE_ENDS = ",;:，；：、"
_SENTENCE_ENDS = ".!?。！？…"


def ended_summary(summary: str, summary_max_chars: SummaryBound = None, lang: str | None = None) -> str:
    """A summary the grammar stopped at its bound (exactly as long as the bound, not ending a sentence), ended at its
    last clause or word in its second half with "…" (the dashboard showed "... right by the," before); others as
    written (a longer one was not stopped: an unguided answer a version without optimism keeps as it came).
    """
    bound = _summary_bound(summary_max_chars, lang)
    if len(summary) != bound or summary[-1] in _SENTENCE_ENDS:
        return summary
    half = bound // 2
    # the stop may fall just after a clause's comma ("... though, right by the,"): the clause before it is whole
    body = summary.rstrip(_CLAUSE_ENDS + " ")
    if not body:
        return summary
    at = max(body.rfind(c) for c in _CLAUSE_ENDS)
    if at < half:  # no clause to end at: the last whole word (the last one is whole if a space or comma followed it)
        at = len(body) if len(body) < len(summary) else body.rfind(" ")
    if at < half:  # one long clause without a space (Chinese): keep it, one character shorter
        return body[: bound - 1] + "…"
    return body[:at].rstrip(_CLAUSE_ENDS + " ") + "…"


def aspects_json(record: ReviewAnalysis, evidence: str | None = None) -> str:
    """The aspects as the compact JSON array stored in review_sentiment.aspects; with evidence (the review's text,
    prompt.aspect_evidence), only those it holds a word of (qwenspark.aspect_evidence)."""
    mentions = [m.model_dump() for m in record.aspects]
    if evidence is not None:
        mentions = evidenced(mentions, evidence)
    return json.dumps(mentions, ensure_ascii=False, separators=(",", ":"))
