"""Label calibration: the sentiment field's token log-probabilities, plus a per-language bias fitted on dev rows.

A small model's label errors are lopsided (the 0.5B default calls 42 of 195 Chinese positives negative on 600
held-out dev rows, and almost never says neutral for a 3-star English review). The engine reports the
log-probabilities of the tokens it could have written where the overall sentiment starts; adding a fixed bias per
language and label to them and taking the best label corrects a lopsided prior without touching the prompt. The
bias is fitted on dev rows only (bench/calibrate.py) and frozen with the prompt version that uses it
(prompts.PromptTemplate.label_bias), so stored results say which calibration made them. The summary and aspects
stay as generated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from qwenspark.schemas import SENTIMENTS

LabelLogprobs = dict[str, float]
# How many alternatives per generated token the engine is asked for: the four labels' first tokens are always among
# the top few where the sentiment starts, and more only costs output processing.
TOP_LOGPROBS = 8
_KEY = '"sentiment"'


def label_logprobs(
    text: str, tokens: Iterable[str], alternatives: Iterable[Mapping[str, float]]
) -> LabelLogprobs | None:
    """The log-probability of each label where the answer's overall sentiment value starts.

    text: the generated answer; tokens: the text of each generated token (joined, they are text); alternatives: per
    generated token, the text of each alternative the engine reported -> its log-probability. Alternatives that
    start the value of more than one label ("ne" for negative and neutral) are left out. None when the answer has no
    sentiment value or the tokens do not line up with the text.
    """
    key = text.find(_KEY)
    if key < 0:
        return None
    quote = text.find('"', text.find(":", key + len(_KEY)) + 1)
    if quote < 0:
        return None
    value = quote + 1  # the first character of the label
    written = ""
    for token, alts in zip(tokens, alternatives, strict=False):
        start, written = len(written), written + token
        if len(written) > value:
            if not text.startswith(written):  # a token that is part of a character ("�"): offsets do not hold
                return None
            prefix = text[start:value]  # what this token writes before the label ('"' when it merges the quote)
            return _by_label(prefix, alts)
    return None


def _by_label(prefix: str, alternatives: Mapping[str, float]) -> LabelLogprobs | None:
    found: dict[str, list[float]] = {}
    for alt, logprob in alternatives.items():
        if not alt.startswith(prefix) or len(alt) == len(prefix):
            continue
        rest = alt[len(prefix) :]
        owners = [label for label in SENTIMENTS if label.startswith(rest) or rest.startswith(label)]
        if len(owners) == 1:
            found.setdefault(owners[0], []).append(logprob)
    if not found:
        return None
    return {label: _logsumexp(values) for label, values in found.items()}


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def calibrated(answer: str, logprobs: LabelLogprobs | None, bias: Mapping[str, float] | None) -> str:
    """The label with the best log-probability + bias among those the engine reported (answer when none)."""
    if not logprobs or not bias:
        return answer
    return max(logprobs, key=lambda label: (logprobs[label] + bias.get(label, 0.0), label == answer))
