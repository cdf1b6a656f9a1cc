"""parse.lines_viable: an unguided answer in lines is dropped only where no continuation of it could be accepted, and
never where it could; checked on the prompt's own answers and on seeded random answers."""

from __future__ import annotations

import random

import pytest

from qwenspark.parse import grammar_misfit, lines_viable, parse_completion
from qwenspark.prompts import TEMPLATES

RULES = [(None, None, False), ("zh", 100, True), ("en", 100, True), ("en", 40, False)]


def accepted(text: str, lang: str | None, max_chars: int | None, script: bool) -> bool:
    """What the optimistic attempt's caller keeps (analyze.PreparedBatch._retry): it parses and fits the grammar."""
    record = parse_completion(text, "stop", answer_format="lines").record
    return record is not None and grammar_misfit(record, lang or "", max_chars, script) is None


def _prefixes(text: str) -> list[str]:
    return [text[:n] for n in range(len(text) + 1)]


@pytest.mark.parametrize(("lang", "max_chars", "script"), RULES)
def test_every_prefix_of_an_accepted_answer_is_viable(lang: str | None, max_chars: int | None, script: bool) -> None:
    answers = [a for _, a in TEMPLATES["v13"].examples]
    answers += ['negative\n"房间很脏，前台态度差。"\nroom:negative service:negative',
                '  mixed \n "Good location, tired rooms" \n location:positive room:negative parking:negative\n\n',
                'positive\nFriendly staff\n', 'neutral\n"A"\n', 'positive\n"Quiet room"\nnoise', 'mixed\n"早餐一般"\n']
    kept = [a for a in answers if accepted(a, lang, max_chars, script)]
    assert len(kept) >= 3  # the check below is about something
    for answer in kept:
        assert all(lines_viable(p, lang, max_chars, script) for p in _prefixes(answer)), answer


@pytest.mark.parametrize(("text", "lang", "max_chars", "script"), [
    ("Positive", None, None, False),                          # a label is lower case
    ("positive.\n", None, None, False),
    ("positive\n\n", None, None, False),                      # an empty summary
    ('positive\n"' + "a" * 101, "en", 100, False),            # past the summary's bound before its line ends
    ('positive\n"Good', "zh", 100, True),                     # an English summary of a Chinese review
    ('positive\n"很好', "en", 100, True),
    ('negative\n"Dirty 房间', "en", 100, True),                 # a Han character inside an English summary
    ('negative\n"Dirty "room', "en", 100, True),               # a quote inside it
    ('positive\n"Nice"\nroom:positive Room', None, None, False),
    ('positive\n"Nice"\n' + " ".join(["room:positive"] * 9), None, None, False),
    ('positive\n"Nice"\nroom:positive\nThe guest liked it', None, None, False),
    ('positive\n"Nice"\nroom=positive ', None, None, False),
    ("\n" * 9, None, None, False),                            # a weak model's loop of blanks before the label
    (" \n" * 4 + "\tpos", "en", 100, True),
])
def test_a_dead_end_is_not_viable(text: str, lang: str | None, max_chars: int | None, script: bool) -> None:
    assert not lines_viable(text, lang, max_chars, script)


LABELS = ["positive", "negative", "mixed", "neutral", "Positive", "neu", "positive."]
WORDS = {"en": ["Great room", " clean", ", ", "a" * 45, "x", '"', "-", "."],
         "zh": ["很好的房间", "，", "好" * 45, "早餐", '"', "Wi"]}
ITEMS = ["room:positive", "service:negative", "parking:good", "noise", "Room:", "breakfast/food:neutral", "::", "x:",
         "value:neutral"]


def _answer(rng: random.Random) -> str:
    """An answer in lines, mostly well formed, often not in one place or another."""
    def pick(good: list[str], bad: list[str]) -> str:
        return rng.choice(good) if rng.random() < 0.75 else rng.choice(bad)

    words = WORDS[rng.choice(["en", "zh"])] if rng.random() < 0.8 else WORDS["en"] + WORDS["zh"]
    quote = pick(['"'], [""])
    summary = quote + "".join(rng.choice(words) for _ in range(rng.randint(0, 3))) + pick([quote], ['"', ""])
    aspects = " ".join(rng.choice(ITEMS) for _ in range(rng.choice([0, 1, 2, 3, 9])))
    return (pick(LABELS[:4], LABELS[4:]) + pick(["\n"], ["\n ", " \n", ""]) + summary + pick(["\n"], ["", "\n\n"])
            + aspects + pick(["", "\n"], ["\nmore", "\n\n", "\n\"\n"]))


@pytest.mark.parametrize(("lang", "max_chars", "script"), RULES)
def test_random_answers_agree_with_the_parser(lang: str | None, max_chars: int | None, script: bool) -> None:
    rng = random.Random(37)
    seen = {"accepted": 0, "dead": 0}
    for _ in range(3000):
        text = _answer(rng)
        if accepted(text, lang, max_chars, script):
            seen["accepted"] += 1
            assert all(lines_viable(p, lang, max_chars, script) for p in _prefixes(text)), repr(text)
        for cut in sorted({rng.randint(0, len(text)) for _ in range(4)}):
            if not lines_viable(text[:cut], lang, max_chars, script):
                seen["dead"] += 1
                for _ in range(10):  # no continuation of a dead end is accepted
                    more = _answer(rng)[rng.randint(0, 30):]
                    assert not accepted(text[:cut] + more, lang, max_chars, script), repr(text[:cut] + more)
                assert not accepted(text[:cut], lang, max_chars, script)
    assert seen["accepted"] > 50 and seen["dead"] > 1000, seen


def test_a_few_blanks_before_the_label_stay_viable() -> None:
    from qwenspark.parse import LEADING_BLANKS

    assert lines_viable("\n" * LEADING_BLANKS, "en", 100, True)
    assert lines_viable(" " * LEADING_BLANKS + 'positive\n"Quiet"', "en", 100, True)
    assert not lines_viable("\n" * (LEADING_BLANKS + 1), "en", 100, True)


class _Chars:
    """A tokenizer whose tokens are the characters' code points."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


@pytest.mark.parametrize("per_step", [1, 2, 5])
def test_a_step_of_several_tokens_is_cut_at_its_first_dead_end(per_step: int) -> None:
    # Speculative decoding's accepted proposals arrive several a step: the answer ends at the token that made it a
    # dead end (here the summary's first Latin letter), as it does one token a step, not at the step's last token.
    from qwenspark.engines.dead_ends import DeadEnds

    text = 'positive\n"Good room, clean"\nroom:positive'  # an English summary of a Chinese review
    first = next(n for n in range(len(text) + 1) if not lines_viable(text[:n], "zh", 100, True))
    assert first == len('positive\n"G')
    ids = [ord(c) for c in text]
    reader, answer, end = DeadEnds(_Chars(), "zh", 100, True), [], None
    while end is None and len(answer) < len(ids):
        answer = ids[:len(answer) + per_step]
        end = reader.dead_end(answer)
    assert end == first
    good = [ord(c) for c in 'positive\n"Nice"\nroom:positive\n']
    assert DeadEnds(_Chars(), "en", 100, True).dead_end(good) is None
