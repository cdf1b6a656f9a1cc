"""engine.frequency_penalty: set from the prompt version, and the transformers engine's own processor."""

from __future__ import annotations

import dataclasses

import pytest

from qwenspark import prompts
from qwenspark.analyze import templated
from qwenspark.config import EngineConfig


def test_the_penalty_subtracts_per_earlier_use_in_the_answer_only() -> None:
    torch = pytest.importorskip("torch")
    from qwenspark.engines.transformers import _FrequencyPenalty

    # Prompt tokens 5 and 5 do not count; the answer so far holds 5 twice and 7 once.
    ids = torch.tensor([[5, 5, 5, 7, 5], [1, 2, 3, 3, 3]])
    scores = torch.zeros(2, 10)
    out = _FrequencyPenalty(0.5, prompt_width=2)(ids, scores)
    assert out[0].tolist() == [0, 0, 0, 0, 0, -1.0, 0, -0.5, 0, 0]
    assert out[1].tolist() == [0, 0, 0, -1.5, 0, 0, 0, 0, 0, 0]
    assert _FrequencyPenalty(0.5, prompt_width=5)(ids, scores).eq(0).all(), "nothing generated yet: no penalty"


def test_the_prompt_version_sets_the_penalty_and_an_explicit_value_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    penalised = dataclasses.replace(prompts.TEMPLATES["v10"], version="vfp", frequency_penalty=0.4)
    monkeypatch.setitem(prompts.TEMPLATES, "vfp", penalised)
    assert templated(EngineConfig(model="m"), "vfp").frequency_penalty == 0.4
    assert templated(EngineConfig(model="m", frequency_penalty=0.1), "vfp").frequency_penalty == 0.1
    assert templated(EngineConfig(model="m"), "v1").frequency_penalty == 0.0


def test_every_engine_follows_one_rule_for_its_attempts() -> None:
    from qwenspark.engines.base import attempt_settings

    # (with the grammar, frequency penalty) of the first attempt, the grammar retry and the penalty retry.
    assert [attempt_settings(False, 0.0, 1.0, r) for r in (None, "grammar", "penalty")] == [
        (True, 0.0), (True, 0.0), (True, 1.0)]
    assert [attempt_settings(True, 0.2, None, r) for r in (None, "grammar", "penalty")] == [
        (False, 0.2), (True, 0.2), (True, 0.2)]
