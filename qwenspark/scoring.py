"""How predictions are scored against labelled reviews: the label semantics, confusion matrices, per-class figures.

The model answers one of four labels (LABELS). Gold labels come in two schemes:
- binary (ChnSentiCorp, zh): positive / negative. A `neutral` or `mixed` answer is wrong: the corpus has no
  middle class, and every review in it leans one way.
- stars (TripAdvisor, en): 1-2 stars negative, 3 neutral, 4-5 positive. A `mixed` answer scores as `neutral`:
  a 3-star review is the middle of the scale, and "praise and complaints of similar weight" (mixed) is what
  most 3-star reviews say. `neutral` scores as `neutral`.
A row without a label (an error) is always wrong. Confusion matrices keep every raw answer in its own column
(the four labels and `error`), so no class is dropped; accuracy and precision/recall/F1 use the scored label,
F1 averaged over the gold classes of the row's scheme (macro-F1). Summaries are checked for their language, for
copying their review (copied) and for repeating the prompt's few-shot summaries (borrowed).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

from qwenspark.parse import looping
from qwenspark.schemas import SENTIMENTS

__all__ = ["looping"]  # defined with the parsing, since the executor repairs looping answers (parse.needs_repair)

LABELS = SENTIMENTS  # the model's answers
ERROR = "error"  # the answer column of a row without a label
ANSWERS = (*LABELS, ERROR)
BINARY, STARS = ("negative", "positive"), ("negative", "neutral", "positive")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[A-Za-z]+")


def scheme(gold: Sequence[str]) -> tuple[str, ...]:
    """The gold scheme of a set of rows: stars when any row is neutral, else binary."""
    return STARS if "neutral" in gold else BINARY


def scored(answer: str | None, classes: tuple[str, ...]) -> str:
    """The label an answer counts as under a gold scheme (ERROR for no answer)."""
    if answer is None:
        return ERROR
    if classes == STARS and answer == "mixed":
        return "neutral"
    return answer


@dataclass(frozen=True)
class ClassScore:
    """Precision, recall and F1 of one gold class, with its support (gold rows)."""

    precision: float
    recall: float
    f1: float
    support: int


def confusion(gold: Sequence[str], answers: Sequence[str | None]) -> dict[str, dict[str, int]]:
    """gold label -> raw answer (LABELS and 'error') -> rows; every answer column present."""
    out = {g: dict.fromkeys(ANSWERS, 0) for g in sorted(set(gold))}
    for g, a in zip(gold, answers, strict=True):
        out[g][a if a in LABELS else ERROR] += 1
    return out


def per_class(gold: Sequence[str], answers: Sequence[str | None]) -> dict[str, ClassScore]:
    """Precision/recall/F1 per gold class of the rows' scheme, on scored labels (0.0 where undefined)."""
    classes = scheme(gold)
    pred = [scored(a, classes) for a in answers]
    out = {}
    for label in classes:
        tp = sum(g == label and p == label for g, p in zip(gold, pred, strict=True))
        out[label] = _score(tp, sum(p == label for p in pred), sum(g == label for g in gold))
    return out


def mentions(marked: Sequence[Collection[str]], named: Sequence[Collection[str] | None]) -> ClassScore:
    """Precision/recall/F1 over (review, item) pairs, e.g. the aspects each review talks about against those its
    answer names (bench/aspect_quality.py); an answer that failed (None) names none. support: the marked pairs."""
    tp = predicted = support = 0
    for gold, answer in zip(marked, named, strict=True):
        got = set(answer or ())
        tp, predicted, support = tp + len(got & set(gold)), predicted + len(got), support + len(gold)
    return _score(tp, predicted, support)


def _score(tp: int, predicted: int, support: int) -> ClassScore:
    """Precision, recall and F1 from the counts (0.0 where undefined), rounded to 4 places."""
    precision = tp / predicted if predicted else 0.0
    recall = tp / support if support else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return ClassScore(round(precision, 4), round(recall, 4), round(f1, 4), support)


def accuracy(gold: Sequence[str], answers: Sequence[str | None]) -> float:
    """Share of rows whose scored answer is the gold label."""
    classes = scheme(gold)
    hits = sum(g == scored(a, classes) for g, a in zip(gold, answers, strict=True))
    return hits / len(gold) if gold else 0.0


def macro_f1(scores: dict[str, ClassScore]) -> float:
    """Mean F1 over every gold class of the scheme (a class never predicted counts 0)."""
    return sum(s.f1 for s in scores.values()) / len(scores) if scores else 0.0


def in_language(summary: str | None, lang: str) -> bool | None:
    """Whether a summary is written in its review's language (zh: at least as many Han characters as Latin words, so
    "WiFi很差" counts; en: Latin words and no Han character); None when there is no summary or the language is
    neither."""
    if not summary or lang not in ("zh", "en"):
        return None
    han, words = len(_HAN.findall(summary)), len(_LATIN_WORD.findall(summary))
    return han >= words and han > 0 if lang == "zh" else han == 0 and words > 0


# A summary is a copy when one verbatim stretch of its review makes up this share of it, and is this long: a short
# review's summary may well repeat it whole ("很好"), a long one's should not be its first hundred characters.
COPIED_SHARE, COPIED_MIN_CHARS = 0.8, 16


def copied(summary: str | None, text: str | None) -> bool | None:
    """Whether a summary is mostly one verbatim stretch of its review (COPIED_SHARE of its characters, at least
    COPIED_MIN_CHARS long, as written: case and punctuation count); None when there is no summary."""
    if not summary:
        return None
    if not text:
        return False
    match = SequenceMatcher(None, text, summary, autojunk=False).find_longest_match(0, len(text), 0, len(summary))
    return match.size >= COPIED_MIN_CHARS and match.size >= COPIED_SHARE * len(summary)


# A summary borrows from the prompt's few-shot answers when it repeats a stretch of one of their summaries that its own
# review does not contain ("...; only the location is good." after a review that never names the location): a claim
# the guest may not have made. Han characters carry about two Latin letters' meaning each, hence the shorter bound.
BORROWED_MIN_CHARS, BORROWED_MIN_HAN = 16, 8
_EDGE = " ,.;:!?，。；：！？、"
_NOT_WORD = re.compile(r"[\W_]+")  # ignored where the review is searched: "overpriced, smelly" ~ "overpriced smelly"


def borrowed(summary: str | None, text: str | None, examples: Sequence[str]) -> bool | None:
    """Whether a summary repeats a stretch of a few-shot example's summary that its review lacks (borrowed_from);
    None when there is no summary."""
    if not summary:
        return None
    return borrowed_from(summary, text, examples) is not None


def borrowed_from(summary: str | None, text: str | None, examples: Sequence[str]) -> int | None:
    """The index of the first few-shot example's summary of which the summary repeats a stretch (at least
    BORROWED_MIN_CHARS characters, BORROWED_MIN_HAN where it holds Han; case and the punctuation at its ends ignored)
    that its review does not contain, punctuation and spacing aside; None when it borrows from none (or is empty)."""
    if not summary:
        return None
    said, review = summary.lower(), _NOT_WORD.sub("", (text or "").lower())
    for k, example in enumerate(examples):
        shown = example.lower()
        if not any(said[p:p + BORROWED_MIN_HAN] in shown for p in range(len(said) - BORROWED_MIN_HAN + 1)):
            continue  # no stretch as long as the shortest loan in common: SequenceMatcher's 0.1 ms spared (service)
        match = SequenceMatcher(None, shown, said, autojunk=False).find_longest_match(0, len(shown), 0, len(said))
        stretch = said[match.b:match.b + match.size].strip(_EDGE)
        bound = BORROWED_MIN_HAN if _HAN.search(stretch) else BORROWED_MIN_CHARS
        if len(stretch) >= bound and _NOT_WORD.sub("", stretch) not in review:
            return k
    return None
