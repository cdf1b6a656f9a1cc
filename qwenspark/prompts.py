"""Review -> chat messages: versioned prompt templates for Chinese and English reviews (pure functions)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from qwenspark.errors import ConfigError
from qwenspark.schemas import ASPECTS, SUMMARY_MAX_CHARS

Message = dict[str, str]

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def detect_lang(text: str, given: str | None) -> str:
    """The review's language: the given code when set, else zh if it has CJK ideographs, else en."""
    if given:
        return given.strip().lower()
    return "zh" if _CJK.search(text) else "en"


@dataclass(frozen=True)
class PromptTemplate:
    """A frozen prompt: a change of wording is a new version, so stored results say which one made them."""

    version: str
    system: str
    examples: tuple[tuple[str, str], ...]  # (review, ideal JSON answer): few-shot turns
    user_prefix: dict[str, str]  # by language; the fallback key is "en"

    def messages(self, text: str, lang: str) -> list[Message]:
        """Chat messages for one review: system, few-shot turns, then the review."""
        msgs: list[Message] = [{"role": "system", "content": self.system}]
        for review, answer in self.examples:
            msgs.append({"role": "user", "content": self._user(review, detect_lang(review, None))})
            msgs.append({"role": "assistant", "content": answer})
        msgs.append({"role": "user", "content": self._user(text, lang)})
        return msgs

    def _user(self, text: str, lang: str) -> str:
        prefix = self.user_prefix.get(lang, self.user_prefix["en"])
        return f"{prefix}\n<review>\n{text}\n</review>"


_V1_SYSTEM = f"""You analyse hotel reviews for a hotel group. Answer with one JSON object only:
{{"sentiment": ..., "summary": ..., "aspects": [{{"aspect": ..., "sentiment": ...}}]}}
- sentiment: the reviewer's overall verdict on the stay.
  positive = satisfied overall (minor complaints allowed); negative = dissatisfied overall;
  mixed = strong praise and strong complaints with no clear overall verdict;
  neutral = no opinion either way (facts only, or "average").
- summary: one short sentence (at most {SUMMARY_MAX_CHARS} characters) in the SAME language as the review.
- aspects: only aspects the review talks about, each once, from: {", ".join(ASPECTS)};
  each with positive, negative or neutral."""


def _answer(sentiment: str, summary: str, aspects: list[tuple[str, str]]) -> str:
    return json.dumps(
        {"sentiment": sentiment, "summary": summary, "aspects": [{"aspect": a, "sentiment": s} for a, s in aspects]},
        ensure_ascii=False,
        separators=(",", ":"),
    )


TEMPLATES: dict[str, PromptTemplate] = {
    "v1": PromptTemplate(
        version="v1",
        system=_V1_SYSTEM,
        examples=(
            (
                "房间很大也很干净，就是隔音太差，半夜被走廊的声音吵醒两次。前台小姐姐态度很好，帮我们换了房。总体还会再来。",
                _answer(
                    "positive",
                    "房间大而干净，隔音差，前台服务好，总体满意。",
                    [("room", "positive"), ("cleanliness", "positive"), ("noise", "negative"), ("service", "positive")],
                ),
            ),
            (
                "overpriced for what you get. the carpet smelled, breakfast was cold and the staff didnt care. "
                "only plus is it's next to the station",
                _answer(
                    "negative",
                    "Overpriced, smelly room, cold breakfast and indifferent staff; only the location is good.",
                    [
                        ("price/value", "negative"),
                        ("room", "negative"),
                        ("breakfast/food", "negative"),
                        ("service", "negative"),
                        ("location", "positive"),
                    ],
                ),
            ),
        ),
        user_prefix={
            "zh": "分析这条酒店评论，摘要用中文写。",
            "en": "Analyse this hotel review; write the summary in English.",
        },
    ),
}


def get_template(version: str) -> PromptTemplate:
    """The template of that version, or a ConfigError naming prompt.version."""
    try:
        return TEMPLATES[version]
    except KeyError:
        raise ConfigError(f"prompt.version: unknown {version!r}; known: {sorted(TEMPLATES)}") from None
