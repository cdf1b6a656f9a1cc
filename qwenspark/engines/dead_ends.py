"""Where an answer in lines written without the grammar stops being able to fit it: the service's and the batch's vLLM
engines end such an attempt there (engine.cut_dead_ends) and generate it again under the grammar."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from qwenspark.config import EngineConfig

if TYPE_CHECKING:
    from qwenspark.parse import SummaryBound

# The finish reason of an attempt ended at its first dead end: no continuation of its text could fit the grammar, so
# the rest of it is not generated. Its caller generates the answer again under the grammar (analyze.PreparedBatch).
DEAD_END = "dead_end"


class DeadEnds:
    """Whether an answer in lines written without the grammar can still fit it (parse.lines_viable), read as its
    token ids grow: each step's new tokens decoded once as the parser will read them (answer_text), held back while
    they end inside a character."""

    def __init__(self, tokenizer: Any, lang: str | None, summary_max_chars: SummaryBound, summary_script: bool) -> None:
        # Imported here, once an attempt, not in viable(), which runs every step (parse imports pyspark's names).
        from qwenspark.engines.vllm import answer_text
        from qwenspark.parse import lines_viable

        self._decode, self._viable = answer_text, lines_viable
        self._tokenizer, self._rules = tokenizer, (lang, summary_max_chars, summary_script)
        self.text, self._read = "", 0

    def viable(self, answer: Sequence[int]) -> bool:
        more = self._decode(self._tokenizer, answer[self._read:])
        if more.endswith("\ufffd"):  # a character's bytes still to come
            return True
        self.text, self._read = self.text + more, len(answer)
        return self._viable(self.text, *self._rules)

    def dead_end(self, answer: Sequence[int]) -> int | None:
        """How many of answer's tokens end it at its first dead end, those not yet read taken one at a time (a step
        may bring several: speculative decoding's accepted proposals); None while it can still fit."""
        for end in range(self._read + 1, len(answer) + 1):
            if not self.viable(answer[:end]):
                return end
        return None


def cuts_dead_ends(cfg: EngineConfig, guided: bool) -> bool:
    """Whether an attempt's answer is read for its dead ends: written without the grammar (guided False) by an
    optimistic version whose answers are in lines, with engine.cut_dead_ends on; never where no attempt has the
    grammar (engine.guided off), which would leave a cut answer nothing to be written again with."""
    return not guided and cfg.guided and cfg.optimistic and cfg.answer_format == "lines" and cfg.cut_dead_ends


def reader(cfg: EngineConfig, tokenizer: Any, lang: str | None) -> DeadEnds:
    """A reader of one attempt's dead ends under cfg's summary rules, for a review in lang."""
    return DeadEnds(tokenizer, lang, cfg.summary_max_chars, cfg.summary_script)
