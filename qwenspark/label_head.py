"""Label head: the model's label log-probabilities combined with a lexical model of labelled hotel reviews.

A 0.5B model reads a long review loosely: on held-out dev rows it called about one Chinese review in six by the
wrong polarity, and it almost never says `neutral` for a 3-star English review, while the words a guest uses
("不会再住", "would not stay again") are strong evidence of the verdict. A head adds that evidence to the model's own:
per language, a logistic regression over hashed n-grams of the review (character 1-4-grams for Chinese, word 1-2-grams
otherwise), fitted on labelled dev reviews, and a small stack on top,

    score(label) = model log-probability(label) + weight * lexical log-probability(label) + bias(label),

fitted on dev rows the lexical model did not see (bench/label_head.py). The label with the best score is stored; the
summary and aspects stay as generated. When the engine reports no log-probabilities (transformers, openai, or a GPU
prompt version that does not ask for them: they cost there), the model's answer counts as a one-hot vote with its
own fitted margin. A language the head has no model for keeps the model's answer.

A head is frozen in a file under qwenspark/heads/ and named by the prompt version that uses it (prompts.py), so
stored results say which head made their label. numpy only: no scikit-learn on executors.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import unicodedata
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from qwenspark.errors import ConfigError
from qwenspark.schemas import SENTIMENTS

HEADS = Path(__file__).with_name("heads")
# Hash buckets of the n-gram features: 2^18 keeps collisions rare for the ~200k n-grams of 6,000 Chinese reviews
# (the file grows with it: float16 weights, about 0.5 MB per class row and language once compressed).
HASH_BITS = 18
_WORD = re.compile(r"[^\W_]+")
_SPACE = re.compile(r"\s+")
LabelLogprobs = Mapping[str, float]


def grams(text: str, lang: str) -> list[str]:
    """The n-grams the lexical model reads: zh character 1-4-grams (whitespace dropped), others word 1-2-grams;
    NFKC and lower case first, so "Ｇｏｏｄ" and "GOOD!" read as "good"."""
    norm = unicodedata.normalize("NFKC", text).lower()
    if lang == "zh":
        chars = _SPACE.sub("", norm)
        return [chars[i : i + n] for n in range(1, 5) for i in range(len(chars) - n + 1)]
    words = _WORD.findall(norm)
    return words + [f"{a} {b}" for a, b in itertools.pairwise(words)]


def hashed(text: str, lang: str, bits: int = HASH_BITS) -> tuple[np.ndarray, np.ndarray]:
    """(bucket ids, sublinear term frequencies 1 + log(count)) of a text's n-grams, ids ascending."""
    mask = (1 << bits) - 1
    ids = np.fromiter((zlib.crc32(g.encode("utf-8")) & mask for g in grams(text, lang)), dtype=np.int64)
    buckets, counts = np.unique(ids, return_counts=True)
    return buckets, 1.0 + np.log(counts)


@dataclass(frozen=True)
class Lexical:
    """One language's lexical model: tf-idf of hashed n-grams (L2-normalised) -> logistic regression."""

    classes: tuple[str, ...]
    idf: np.ndarray  # [buckets]
    coef: np.ndarray  # [1, buckets] for two classes (the logit of classes[1]), else [classes, buckets]
    intercept: np.ndarray  # [1] or [classes]

    def log_proba(self, text: str, lang: str) -> dict[str, float]:
        """Each class's log-probability for text (a text without n-grams gets the intercepts alone)."""
        ids, tf = hashed(text, lang, int(math.log2(self.idf.shape[0])))
        values = tf * self.idf[ids]
        norm = float(np.sqrt(values @ values))
        if norm > 0:
            values = values / norm
        logits = self.coef[:, ids].astype(np.float64) @ values + self.intercept
        if len(self.classes) == 2:
            z = float(logits[0])
            return {self.classes[0]: -_softplus(z), self.classes[1]: -_softplus(-z)}
        top = float(np.max(logits))
        log_norm = top + math.log(float(np.sum(np.exp(logits - top))))
        return {c: float(v) - log_norm for c, v in zip(self.classes, logits, strict=True)}


def _softplus(z: float) -> float:
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


@dataclass(frozen=True)
class Stack:
    """How one language's scores are combined (see the module docstring)."""

    weight: float  # on the lexical log-probabilities
    bias: Mapping[str, float]  # per label; absent labels 0
    margin: float  # without model log-probabilities: the answer's lead over the other labels


@dataclass(frozen=True)
class LanguageHead:
    """The lexical model of one language and its two stacks (with and without model log-probabilities)."""

    lexical: Lexical
    with_logprobs: Stack
    without_logprobs: Stack

    def label(self, answer: str, logprobs: LabelLogprobs | None, text: str, lang: str) -> str:
        """The label with the best combined score."""
        lexical = self.lexical.log_proba(text, lang)
        if logprobs:
            stack, model = self.with_logprobs, _model_scores(logprobs)
        else:
            stack = self.without_logprobs
            model = {label: 0.0 if label == answer else -stack.margin for label in SENTIMENTS}
        scores = {label: model[label] + stack.weight * _lexical_score(label, lexical) + stack.bias.get(label, 0.0)
                  for label in SENTIMENTS}
        return max(SENTIMENTS, key=lambda label: (scores[label], label == answer))


def _model_scores(logprobs: LabelLogprobs) -> dict[str, float]:
    # A label the engine did not report among its top alternatives gets a floor below the lowest reported one, so
    # strong lexical evidence can still choose it.
    floor = min(logprobs.values()) - 1.0
    return {label: float(logprobs.get(label, floor)) for label in SENTIMENTS}


def _lexical_score(label: str, lexical: Mapping[str, float]) -> float:
    """A label's lexical log-probability. mixed reads as neutral where the model has a middle class (star gold:
    3 stars); a label without a class of its own (neutral/mixed under binary gold) gets the mean of the classes,
    highest when the evidence is balanced."""
    if label in lexical:
        return lexical[label]
    if label == "mixed" and "neutral" in lexical:
        return lexical["neutral"]
    return sum(lexical.values()) / len(lexical)


@dataclass(frozen=True)
class LabelHead:
    """A frozen head: per language, its lexical model and stacks; provenance says how it was fitted."""

    name: str
    languages: Mapping[str, LanguageHead]
    provenance: Mapping[str, object]

    def label(self, answer: str, logprobs: LabelLogprobs | None, text: str, lang: str) -> str:
        """The head's label for a review (the model's answer where the head has no model for its language)."""
        head = self.languages.get(lang)
        return answer if head is None else head.label(answer, logprobs, text, lang)


def save_head(path: Path, languages: Mapping[str, LanguageHead], provenance: Mapping[str, object]) -> None:
    """Write a head file (numpy .npz: arrays per language plus one JSON string of classes, stacks, provenance)."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, object] = {"provenance": dict(provenance), "languages": {}}
    for lang, head in languages.items():
        arrays[f"{lang}.idf"] = head.lexical.idf.astype(np.float16)
        arrays[f"{lang}.coef"] = head.lexical.coef.astype(np.float16)
        arrays[f"{lang}.intercept"] = head.lexical.intercept.astype(np.float64)
        meta["languages"][lang] = {  # type: ignore[index]
            "classes": list(head.lexical.classes),
            "with_logprobs": _stack_dict(head.with_logprobs),
            "without_logprobs": _stack_dict(head.without_logprobs),
        }
    arrays["meta"] = np.array(json.dumps(meta, ensure_ascii=False, sort_keys=True))
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]


def _stack_dict(stack: Stack) -> dict[str, object]:
    return {"weight": stack.weight, "bias": dict(stack.bias), "margin": stack.margin}


def _stack(d: Mapping[str, object]) -> Stack:
    bias = d["bias"]
    assert isinstance(bias, dict)
    return Stack(weight=float(d["weight"]), bias={str(k): float(v) for k, v in bias.items()},  # type: ignore[arg-type]
                 margin=float(d["margin"]))  # type: ignore[arg-type]


def read_head(path: Path) -> LabelHead:
    """Load a head file written by save_head."""
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        languages = {
            lang: LanguageHead(
                lexical=Lexical(
                    classes=tuple(spec["classes"]),
                    idf=data[f"{lang}.idf"].astype(np.float32),
                    coef=data[f"{lang}.coef"].astype(np.float32),
                    intercept=data[f"{lang}.intercept"].astype(np.float64),
                ),
                with_logprobs=_stack(spec["with_logprobs"]),
                without_logprobs=_stack(spec["without_logprobs"]),
            )
            for lang, spec in meta["languages"].items()
        }
    return LabelHead(name=path.stem, languages=languages, provenance=meta["provenance"])


@cache
def get_head(name: str) -> LabelHead:
    """The packaged head of that name (loaded once per process)."""
    path = HEADS / f"{name}.npz"
    if not path.is_file():
        known = sorted(p.stem for p in HEADS.glob("*.npz"))
        raise ConfigError(f"label head {name!r} is not packaged (known: {', '.join(known) or 'none'})")
    return read_head(path)
