"""engine.batch_grammar_masks through real vLLM (the tiny random Qwen3, engine core in the process): the plugin is
loaded by vLLM's own plugin loader from the package's entry point, fills the guided steps' masks, and the answers
are those of vLLM's own fill, token for token. In a fresh interpreter: vLLM loads plugins once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from qwenspark.config import EngineConfig
from qwenspark.engines import build_engine, vllm_masks
from qwenspark.prompts import get_template
from tests.conftest import SAMPLE_REVIEWS

template = get_template("v13-guided")
cfg = EngineConfig(kind="vllm", model=sys.argv[1], dtype="auto", max_tokens=96, max_model_len=2048,
                   engine_kwargs=json.loads(sys.argv[2]),
                   summary_max_chars=template.summary_max_chars, summary_script=True, aspect_map=template.aspect_map,
                   answer_format=template.answer_format, batch_grammar_masks=2,
                   env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"})
reviews = [(t, lang) for t, lang in SAMPLE_REVIEWS if lang in ("zh", "en")] * 3
conversations = [template.messages(t, lang) for t, lang in reviews]
langs = [lang for _, lang in reviews]
engine = build_engine(cfg)
batch = engine.generate(conversations, langs)
steps = vllm_masks.FILLED["steps"]
from vllm.v1.structured_output import StructuredOutputManager
StructuredOutputManager.grammar_bitmask = StructuredOutputManager._qwenspark_own_grammar_bitmask
# The second run computes its prompts afresh, as the first did: answers from cached prefixes may differ in bf16's
# last bits, and a random model's near-ties then flip a token (test_engines saw it in CI).
assert engine._feed._engine.reset_prefix_cache(), "the prefix cache was not emptied"
own = engine.generate(conversations, langs)
engine.close()
print("RESULT " + json.dumps({"steps": steps, "after": vllm_masks.FILLED["steps"],
                              "drafted": vllm_masks.FILLED["drafted"],
                              "batch": [[c.text, c.tokens_out] for c in batch],
                              "own": [[c.text, c.tokens_out] for c in own]}))
"""


NGRAM = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                                 "prompt_lookup_max": 4}}  # the service's CPU default (serve/engine.py)


@pytest.mark.parametrize("kwargs", [{}, NGRAM], ids=["plain", "ngram-drafts"])
def test_the_batch_matcher_fills_the_steps_and_answers_as_vllms_own_fill(tiny_model: Path, kwargs: dict) -> None:
    # Not pytest's own engine settings: earlier tests' engines leave conf/local.yaml's VLLM_LOGGING_LEVEL=WARNING there,
    # which would hide the plugin's line.
    env = {k: v for k, v in os.environ.items() if k != "QWENSPARK_BATCH_GRAMMAR_MASKS"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model), json.dumps(kwargs)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False,
                         env={**env, "PYTHONPATH": str(ROOT), "VLLM_LOGGING_LEVEL": "INFO"})
    assert run.returncode == 0, run.stderr[-3000:]
    [line] = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    answers = len(result["batch"])
    # every guided step after the first (where vLLM allocates the bitmask) was the batch matcher's: one token a step,
    # or with proposals up to all of them taken and the bonus token
    per_step = 1 + (kwargs["speculative_config"]["num_speculative_tokens"] if kwargs else 0)
    assert result["steps"] >= max(tokens for _, tokens in result["batch"]) / per_step - 1 > 0, result["steps"]
    assert result["after"] == result["steps"]  # vLLM's own fill put back: the second run never reached it
    # with proposals, steps that carried draft tokens (a mask per draft position) were the batch matcher's too
    assert (result["drafted"] > 0) == bool(kwargs), result["drafted"]
    assert result["batch"] == result["own"] and answers == 18  # SAMPLE_REVIEWS in zh and en, three times
    assert "grammar masks filled by xgrammar's batch matcher (2 threads)" in run.stderr + run.stdout  # the log says
