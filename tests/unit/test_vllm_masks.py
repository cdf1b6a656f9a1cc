"""engines/vllm_masks.py: a step's grammar masks from xgrammar's batch matcher are vLLM's own, bit for bit; the plugin
patches vLLM only where the engine's environment asks, once; steps it cannot take go to vLLM's own code."""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from qwenspark.config import load_config
from qwenspark.engines import vllm_masks
from qwenspark.parse import answer_grammars
from qwenspark.serve.app import serve_engine_config

xgr = pytest.importorskip("xgrammar")
torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
ANSWERS = {
    "en": 'negative\n"The room was dirty and the staff were rude; breakfast was cold."\nroom:negative '
          "service:negative breakfast/food:negative",
    "zh": 'mixed\n"房间干净，早餐一般，服务有待提高。"\nroom:positive breakfast/food:neutral service:negative',
}


@pytest.fixture(scope="module")
def step(tiny_model: Path) -> dict[str, Any]:
    """A step of 24 guided answers under v13's grammars, each at a seeded point of a real answer, 3 of them ended;
    each request also holds the rest of its answer (rest: token ids, the stop token last)."""
    from transformers import AutoTokenizer
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    vocab = len(tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    grammars = answer_grammars(serve_engine_config(load_config(ROOT / "conf" / "local.yaml", ["prompt.version=v13"])))
    compiled = {lang: compiler.compile_grammar(grammars[lang]["grammar"]) for lang in ANSWERS}
    rng = random.Random(7)
    requests: dict[str, Any] = {}
    for n in range(24):
        lang = "zh" if n % 2 else "en"
        ids = [*tokenizer.encode(ANSWERS[lang], add_special_tokens=False), info.stop_token_ids[0]]
        grammar = XgrammarGrammar(vocab_size=vocab, matcher=xgr.GrammarMatcher(compiled[lang]), ctx=compiled[lang])
        ended = n in (5, 12, 19)
        # request 22: two tokens before its stop token, so that its drafts run through the answer's end
        taken = ids if ended else ids[: len(ids) - 3] if n == 22 else ids[: rng.randrange(len(ids) - 1)]
        assert grammar.accept_tokens(str(n), taken)
        assert grammar.is_terminated() == ended
        requests[str(n)] = SimpleNamespace(structured_output_request=SimpleNamespace(grammar=grammar),
                                           rest=ids[len(taken):])
    return {"requests": requests, "vocab": vocab}


SPEC = 4  # draft tokens a step, as the service's n-gram proposals (serve/engine.py SERVE_CPU_DEFAULTS)


def _manager(vocab: int, *, spec: int = 0, reasoner: Any = None) -> Any:
    """What batch_fill reads of vLLM's StructuredOutputManager, with the bitmask vLLM allocates at its first step,
    left as an earlier step wrote it (zeros: nothing allowed), so that every row must be written."""
    return SimpleNamespace(
        vllm_config=SimpleNamespace(num_speculative_tokens=spec, model_config=SimpleNamespace(is_diffusion=False)),
        reasoner_cls=reasoner, _grammar_bitmask=xgr.allocate_token_bitmask(32 * (1 + spec), vocab).zero_(),
        _full_mask=torch.tensor(-1, dtype=torch.int32))


def test_the_batch_matchers_masks_are_vllms_own(step: dict[str, Any]) -> None:
    from vllm.v1.structured_output import StructuredOutputManager

    ids = list(step["requests"])
    rng = random.Random(3)
    rng.shuffle(ids)  # rows follow the step's order, not the requests'
    ours = _manager(step["vocab"])
    got = vllm_masks.batch_fill(ours, step["requests"], ids, "2").copy()
    theirs = _manager(step["vocab"])
    StructuredOutputManager._fill_bitmasks(theirs, [  # vLLM's serial path, row by row
        (step["requests"][rid].structured_output_request.grammar, row, True) for row, rid in enumerate(ids)])
    expected = theirs._grammar_bitmask[: len(ids)].numpy()
    assert got.shape == expected.shape == (24, ours._grammar_bitmask.shape[1])
    assert (got == expected).all()
    ended = [row for row, rid in enumerate(ids) if rid in ("5", "12", "19")]
    assert all((got[row] == -1).all() for row in ended)  # every token allowed, as vLLM writes it
    assert sum(not (got[row] == -1).all() for row in range(len(ids))) == 21  # the others are real masks


def _refused(grammar: Any, vocab: int) -> int:
    """A token id the grammar refuses where it stands (its state unchanged)."""
    for token in range(vocab):
        if not grammar.matcher.accept_token(token):
            return token
        grammar.matcher.rollback(1)
    raise AssertionError("the grammar takes every token")


def test_with_draft_tokens_the_batch_matchers_masks_are_vllms_own(step: dict[str, Any]) -> None:
    from vllm.v1.structured_output import _CONSTRAINED_FROM_START, StructuredOutputManager

    requests, vocab = step["requests"], step["vocab"]
    ids = list(requests)
    random.Random(5).shuffle(ids)
    drafts: dict[str, list[int]] = {}
    for n, rid in enumerate(ids):  # each way vLLM's walk can go, over the step's answers
        rest, grammar = requests[rid].rest, requests[rid].structured_output_request.grammar
        refused = _refused(grammar, vocab) if not grammar.is_terminated() else 0
        drafts[rid] = [
            [],                                 # no proposal this step: one row
            rest[:SPEC],                        # the answer's own next tokens, all taken (22: through its stop token)
            [*rest[:1], refused, *rest[1:3]],   # the second refused: its row's mask for the rows after it
            [*rest[:1], -1, -1, -1],            # the proposer's padding: every token allowed after it
            [refused, *rest[:2]],               # the first refused
            rest[:2],                           # fewer than SPEC
        ][n % 6] if not grammar.is_terminated() else [3, 4]  # an ended answer's drafts: refused at the first
    drafts["22"] = requests["22"].rest[:SPEC]
    before = [(g.num_processed_tokens, g.is_terminated())
              for g in (requests[rid].structured_output_request.grammar for rid in ids)]

    got = vllm_masks.batch_fill(_manager(vocab, spec=SPEC), requests, ids, "2", drafts).copy()
    theirs = _manager(vocab, spec=SPEC)
    theirs.fill_bitmask_parallel_threshold = 128
    theirs._get_constraint_bounds = lambda request, tokens, **_: _CONSTRAINED_FROM_START  # no reasoning parser
    theirs._fill_bitmasks = lambda batch: StructuredOutputManager._fill_bitmasks(theirs, batch)
    expected = StructuredOutputManager.grammar_bitmask(theirs, requests, ids, drafts)

    rows = sum(len(d) + 1 for d in drafts.values())
    assert got.shape == expected.shape == (rows, theirs._grammar_bitmask.shape[1])
    assert (got == expected).all()
    assert [(g.num_processed_tokens, g.is_terminated()) for g in
            (requests[rid].structured_output_request.grammar for rid in ids)] == before  # matchers rolled back
    start = sum(len(drafts[rid]) + 1 for rid in ids[: ids.index("22")])
    # 22's drafts end its answer: real masks up to its stop token, every token allowed for the bonus token after it
    assert [bool((got[start + k] == -1).all()) for k in range(4)] == [False, False, False, True]
    assert sum(not (row == -1).all() for row in got) > len(ids)  # real masks beyond one an answer


@pytest.mark.parametrize("manager", [
    {"reasoner": object},        # a reasoning parser decides where the grammar starts
])
def test_steps_it_cannot_take_go_to_vllms_own_code(step: dict[str, Any], manager: dict[str, Any]) -> None:
    assert vllm_masks.batch_fill(_manager(step["vocab"], **manager), step["requests"], list(step["requests"]),
                                 "2") is None
    unallocated = _manager(step["vocab"])
    unallocated._grammar_bitmask = None  # the first guided step: vLLM allocates it
    assert vllm_masks.batch_fill(unallocated, step["requests"], ["0"], "2") is None
    other = {"x": SimpleNamespace(structured_output_request=SimpleNamespace(grammar=SimpleNamespace()))}
    assert vllm_masks.batch_fill(_manager(step["vocab"]), other, ["x"], "2") is None  # not xgrammar's


def test_the_plugin_patches_vllm_only_when_asked_and_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.structured_output import StructuredOutputManager

    own = StructuredOutputManager.grammar_bitmask
    # restored at teardown: other tests' in-process engines must keep vLLM's own fill
    monkeypatch.setattr(StructuredOutputManager, "grammar_bitmask", own)
    monkeypatch.setattr(StructuredOutputManager, "_qwenspark_batch_masks", False, raising=False)
    monkeypatch.delenv(vllm_masks.ENV, raising=False)
    vllm_masks.register()
    assert StructuredOutputManager.grammar_bitmask is own
    monkeypatch.setenv(vllm_masks.ENV, "2")
    vllm_masks.register()
    patched = StructuredOutputManager.grammar_bitmask
    assert patched is not own
    vllm_masks.register()  # vLLM may load plugins again in the same process
    assert StructuredOutputManager.grammar_bitmask is patched


def test_the_engine_setting_reaches_the_environment_vllm_starts_from(monkeypatch: pytest.MonkeyPatch) -> None:
    from qwenspark.config import EngineConfig
    from qwenspark.engines.vllm import apply_env

    monkeypatch.setenv(vllm_masks.ENV, "")  # recorded, so that what apply_env sets is undone at teardown
    monkeypatch.delenv(vllm_masks.ENV)
    apply_env(EngineConfig(kind="vllm", model="m"))
    assert vllm_masks.ENV not in os.environ
    apply_env(EngineConfig(kind="vllm", model="m", batch_grammar_masks=4))
    assert os.environ[vllm_masks.ENV] == "4"
    apply_env(EngineConfig(kind="vllm", model="m"))  # unset leaves it to the environment (the service decides)
    assert os.environ[vllm_masks.ENV] == "4"
    apply_env(EngineConfig(kind="vllm", model="m", batch_grammar_masks=0))  # a chosen 0 wins over an inherited 4
    assert os.environ[vllm_masks.ENV] == "0"


@pytest.mark.parametrize(("cores", "threads"), [(1, 0), (3, 0), (4, 2), (8, 4), (16, 8), (128, 8)])
def test_service_mask_threads_are_half_the_cores_at_most_8(cores: int, threads: int) -> None:
    from qwenspark.resources import service_mask_threads

    assert service_mask_threads(cores) == threads


def test_the_service_on_a_gpu_takes_the_batch_matcher_unless_told_otherwise() -> None:
    from qwenspark.config import EngineConfig
    from qwenspark.serve.engine import gpu_mask_threads

    unset = EngineConfig(kind="vllm", model="m")
    environ: dict[str, str] = {}
    assert gpu_mask_threads(unset, environ, 16) == "8" and environ == {vllm_masks.ENV: "8"}
    assert gpu_mask_threads(unset, {}, 2) == "", "under 4 cores: vLLM's own fill"
    assert gpu_mask_threads(unset, {vllm_masks.ENV: "3"}, 16) == "3", "the shell's count wins"
    assert gpu_mask_threads(unset, {vllm_masks.ENV: "auto"}, 16) == "auto", "xgrammar's own count, as the plugin reads"
    chosen = {vllm_masks.ENV: "0"}  # what apply_env sets for engine.batch_grammar_masks: 0
    assert gpu_mask_threads(EngineConfig(kind="vllm", model="m", batch_grammar_masks=0), chosen, 16) == ""
