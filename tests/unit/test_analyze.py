"""The executor function with fake engines: one row out per row in, per-row errors, fatal errors and bugs propagate."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd
import pytest

from qwenspark.analyze import AnalyzeSpec, analyze_chunk, make_analyze_fn
from qwenspark.config import EngineConfig
from qwenspark.engines import cache
from qwenspark.engines.base import Completion, Message
from qwenspark.engines.dead_ends import DEAD_END
from qwenspark.errors import RequestError
from qwenspark.schemas import EXECUTOR_OUT_SCHEMA, NULL_MICROS, RESULT_COLUMNS

GOOD = json.dumps({"sentiment": "positive", "summary": "ok", "aspects": [{"aspect": "room", "sentiment": "positive"}]})


class FakeEngine:
    """Answers GOOD, except: refuses reviews containing 'REFUSE', babbles for 'BABBLE', dies for 'DIE';
    'BUG' raises a TypeError from generate and 'BADVALUE' a ValueError from encode (bugs, not refusals)."""

    model_name = "fake"

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.langs: list[str | None] = []  # the review language given with each request

    def encode(self, text: str) -> list[int]:
        if "BADVALUE" in text:
            raise ValueError("invalid literal for int() with base 10: 'x'")
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None
    ) -> list[Completion]:
        self.calls.append(len(conversations))
        self.langs.extend(langs if langs is not None else [None] * len(conversations))
        reviews = [c[-1]["content"] for c in conversations]
        if any("DIE" in r for r in reviews):
            raise RuntimeError("CUDA error: device lost")
        if any("BUG" in r for r in reviews):
            raise TypeError("'NoneType' object is not subscriptable")
        if any("REFUSE" in r for r in reviews):
            raise RequestError("prompt too long")
        return [
            Completion("I think it is nice" if "BABBLE" in r else GOOD, "stop", len(r), 12) for r in reviews
        ]

    def close(self) -> None:
        pass


def _spec(batch_size: int = 4, max_tokens: int = 50) -> AnalyzeSpec:
    return AnalyzeSpec(
        engine=EngineConfig(model="fake", batch_size=batch_size), prompt_version="v1", max_review_tokens=max_tokens
    )


def _frame(texts: list[str | None], errors: list[str | None] | None = None) -> pd.DataFrame:
    n = len(texts)
    return pd.DataFrame(
        {
            "review_id": range(1, n + 1),
            "hotel_id": ["H1"] * n,
            "created_at": pd.Timestamp("2026-11-01"),
            "lang": [None] * n,
            "text": texts,
            "input_key": ["k"] * n,
            "clean_error": errors or [None] * n,
        }
    )


def test_one_row_out_per_row_in_with_every_kind_of_error() -> None:
    texts = ["nice", None, "REFUSE me", "BABBLE", "x" * 80, "good"]
    errors = [None, "empty: text is NULL", None, None, None, None]
    out = analyze_chunk(FakeEngine(), _frame(texts, errors), _spec())
    assert list(out.columns) == list(RESULT_COLUMNS)
    assert out["review_id"].tolist() == [1, 2, 3, 4, 5, 6]
    err = out["error"].tolist()
    assert err[0] is None and out["sentiment"][0] == "positive"
    assert err[1] == "empty: text is NULL" and out["tokens_in"][1] == 0
    assert err[2] == "engine refused the request: prompt too long"
    assert err[3].startswith("parse: not JSON")
    assert err[4] is None and bool(out["truncated"][4]) and not out["truncated"][0]
    assert err[5] is None
    # every row has a result or an error, never neither
    assert all((e is None) != (s is None) for e, s in zip(out["error"], out["sentiment"], strict=True))


def test_fatal_engine_error_fails_the_task() -> None:
    with pytest.raises(RuntimeError, match="device lost"):
        analyze_chunk(FakeEngine(), _frame(["fine", "DIE"]), _spec())


def test_partition_function_rechunks_and_loads_engine_once() -> None:
    cache.clear()
    made: list[FakeEngine] = []

    def factory(cfg: EngineConfig) -> FakeEngine:
        made.append(FakeEngine())
        return made[-1]

    fn = make_analyze_fn(_spec(batch_size=4), engine_factory=factory)
    frames = [_frame(["a"] * 3), _frame(["b"] * 6), _frame(["c"] * 1)]
    out = pd.concat(list(fn(iter(frames))))
    assert len(out) == 10
    out2 = pd.concat(list(fn(iter([_frame(["d"] * 5)]))))
    assert len(out2) == 5
    assert len(made) == 1, "the engine is cached per process"
    assert made[0].calls == [4, 4, 2, 4, 1]
    cache.clear()


@pytest.mark.parametrize(("version", "order"), [("v1", ("verdict_first", None, False)),
                                                ("v3", ("verdict_last", None, False)),
                                                ("v4", ("verdict_first", 100, False)),
                                                ("v7", ("verdict_first", 100, True))])
def test_the_engine_is_built_with_the_templates_answer_order(version: str, order: tuple[str, int | None, bool]) -> None:
    cache.clear()
    orders: list[tuple[str, int | None, bool]] = []

    def factory(cfg: EngineConfig) -> FakeEngine:
        orders.append((cfg.answer_order, cfg.summary_max_chars, cfg.summary_script))
        return FakeEngine()

    spec = AnalyzeSpec(engine=EngineConfig(model="fake", batch_size=4), prompt_version=version, max_review_tokens=50)
    assert len(pd.concat(list(make_analyze_fn(spec, engine_factory=factory)(iter([_frame(["a"] * 2)]))))) == 2
    assert orders == [order]
    cache.clear()


def test_empty_partition_loads_nothing() -> None:
    cache.clear()
    fn = make_analyze_fn(_spec(), engine_factory=lambda cfg: pytest.fail("loaded"))
    assert list(fn(iter([]))) == []


# BADVALUE past the cap's bytes (_spec: 50), so that the cap tokenises it (batching.truncate_by_tokens)
@pytest.mark.parametrize(("text", "error"), [("a BUG here", TypeError), ("BADVALUE " * 8, ValueError)])
def test_a_bug_fails_the_task_instead_of_becoming_error_rows(text: str, error: type[Exception]) -> None:
    # Before: any ValueError/TypeError was taken for the engine refusing a row, so a code bug stored an error row
    # for every review and the run committed them. Only RequestError is a refusal now.
    with pytest.raises(error):
        analyze_chunk(FakeEngine(), _frame(["fine", text, "good"]), _spec())


class BuggyStreamingEngine(FakeEngine):
    """A continuous-feed engine whose submit has a bug for reviews containing 'BUG' (and refuses 'REFUSE')."""

    def __init__(self) -> None:
        super().__init__()
        self.live: list[str] = []

    def submit(self, conversation: Sequence[Message], lang: str | None = None) -> str:
        review = conversation[-1]["content"]
        if "BUG" in review:
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")
        if "REFUSE" in review:
            raise RequestError("too long")
        self.langs.append(lang)
        self.live.append(f"r{len(self.live)}")
        return self.live[-1]

    def step(self) -> list[tuple[str, Completion]]:
        done, self.live = self.live, []
        return [(rid, Completion(GOOD, "stop", 1, 1)) for rid in done]

    def abort(self, request_ids: Sequence[str]) -> None:
        self.live = [r for r in self.live if r not in request_ids]


def test_continuous_feed_refusal_is_a_row_error_and_a_bug_fails_the_task() -> None:
    cache.clear()
    spec = AnalyzeSpec(
        engine=EngineConfig(model="fake", batch_size=2, continuous=True), prompt_version="v1", max_review_tokens=50
    )
    out = pd.concat(list(make_analyze_fn(spec, engine_factory=lambda cfg: BuggyStreamingEngine())(
        iter([_frame(["fine", "REFUSE", "good"])]))))
    assert out["error"].tolist() == [None, "engine refused the request: too long", None]
    cache.clear()
    with pytest.raises(TypeError, match="unsupported operand"):
        list(make_analyze_fn(spec, engine_factory=lambda cfg: BuggyStreamingEngine())(
            iter([_frame(["fine", "BUG", "good"])])))
    cache.clear()


def test_timestamps_pass_through_as_microseconds() -> None:
    # The executor copies created_at as it comes (microseconds, NULL as NULL_MICROS: schemas.to_executor) and
    # stamps analysed_at in microseconds: no datetime64[ns] anywhere, so 9999-12-31 cannot overflow.
    micros = [253402300799000000, NULL_MICROS, -30610224000000000]
    frame = _frame(["a", "b", "c"]).assign(created_at=micros)
    out = analyze_chunk(FakeEngine(), frame, _spec())
    assert out["review_created_at"].tolist() == micros and str(out["review_created_at"].dtype) == "int64"
    assert str(out["analysed_at"].dtype) == "int64" and out["analysed_at"].iloc[0] > 1_700_000_000_000_000
    assert [f.name for f in EXECUTOR_OUT_SCHEMA.fields] == list(RESULT_COLUMNS)


@pytest.mark.parametrize("continuous", [False, True])
def test_each_request_carries_its_reviews_language(continuous: bool) -> None:
    # The engine picks the summary's grammar by it (engine.summary_script): a given code wins, else detected.
    cache.clear()
    made: list[FakeEngine] = []

    def factory(cfg: EngineConfig) -> FakeEngine:
        made.append(BuggyStreamingEngine() if continuous else FakeEngine())
        return made[-1]

    spec = AnalyzeSpec(engine=EngineConfig(model="fake", batch_size=3, continuous=continuous), prompt_version="v7",
                       max_review_tokens=50)
    frame = _frame(["房间很好", "nice room", None, "good", "très bien"],
                   [None, None, "empty: text is NULL", None, None]).assign(lang=[None, None, None, "ZH", "fr"])
    out = pd.concat(list(make_analyze_fn(spec, engine_factory=factory)(iter([frame]))))
    assert len(out) == 5 and len(made) == 1
    assert made[0].langs == ["zh", "en", "zh", "fr"]
    cache.clear()


class MisfitLines(FakeEngine):
    """v13's lines, by generate or submit/step: a first attempt (no retry) whose summary is over the grammar's bound
    unless `fits`; any retry short and valid. Records each request's retry (what the assertions read)."""

    model_name = "misfit-lines"

    def __init__(self) -> None:
        super().__init__()
        self.fits = False
        self.retries: list[str | None] = []
        self._done: list[tuple[str, Completion]] = []

    def _answer(self, retry: str | None) -> Completion:
        self.retries.append(retry)
        long = ("The guest found the room dirty, the staff slow to help, the breakfast cold and the street noisy all "
                "night.")
        summary = "Short." if retry is not None or self.fits else long
        return Completion(f'negative\n"{summary}"\nroom:negative', "stop", 100, 20)

    def generate(self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None,
                 retry: str | None = None) -> list[Completion]:
        return [self._answer(retry) for _ in conversations]

    def submit(self, conversation: Sequence[Message], lang: str | None = None, *, retry: str | None = None) -> str:
        rid = f"r{len(self.retries)}"
        self._done.append((rid, self._answer(retry)))
        return rid

    def step(self) -> list[tuple[str, Completion | str]]:
        done, self._done = self._done, []
        return list(done)

    def abort(self, request_ids: Sequence[str]) -> None:
        pass


@pytest.mark.parametrize("continuous", [False, True])
def test_batches_go_guided_from_the_first_token_while_optimistic_answers_misfit(continuous: bool) -> None:
    # engine.optimistic_min_fit (0.6) over a window of 8 first answers: the first batch (2 reviews) is written
    # without the grammar and both misfit, so the next batches ask for the grammar from their first token ("grammar"
    # on the first request, no second attempt), but for one batch in 20 (a probe); once the probes fit, the share
    # climbs back over 0.6 and batches are optimistic again. Every row is stored valid throughout.
    cache.clear()
    engine = MisfitLines()
    spec = AnalyzeSpec(engine=EngineConfig(model="fake", batch_size=2, optimistic_window=8, continuous=continuous,
                                           max_in_flight=1), prompt_version="v13", max_review_tokens=50)
    fn = make_analyze_fn(spec, engine_factory=lambda cfg: engine)

    def run(rows: int) -> pd.DataFrame:
        out = pd.concat(list(fn(iter([_frame(["The room was dirty."] * rows)]))))
        assert len(out) == rows and out["error"].isna().all() and (out["sentiment"] == "negative").all()
        return out

    run(60)  # 30 batches: optimistic, then guided but for the probe (the 20th guided choice, batch 21)
    misfit = [None, None, "grammar", "grammar"]  # a batch written without the grammar: 2 first answers, 2 retries
    guided = ["grammar", "grammar"]
    assert engine.retries == misfit + guided * 19 + misfit + guided * 9
    engine.retries.clear()
    engine.fits = True
    # 60 batches: the probes at the 40th, 60th and 80th guided choices fit (2 of 6, 4 of 8, then 6 of 8 once the
    # first batch's misfits leave the window): optimistic from there on, and fitting (no second attempts).
    run(2 * 60)
    fit = [None, None]
    assert engine.retries == guided * 10 + fit + guided * 19 + fit + guided * 19 + fit + fit * 9
    cache.clear()


def test_an_optimistic_engine_stays_optimistic_with_min_fit_zero() -> None:
    cache.clear()
    engine = MisfitLines()
    spec = AnalyzeSpec(engine=EngineConfig(model="fake", batch_size=2, optimistic_window=8, optimistic_min_fit=0.0,
                                           continuous=False), prompt_version="v13", max_review_tokens=50)
    out = pd.concat(list(make_analyze_fn(spec, engine_factory=lambda cfg: engine)(iter([_frame(["Dirty."] * 20)]))))
    assert len(out) == 20 and engine.retries == [None, None, "grammar", "grammar"] * 10
    cache.clear()


class DeadEndLines(MisfitLines):
    """First attempts the engine ended at their first dead end (engines.dead_ends): blank lines for a review that says
    "blank", else a Chinese word in an English summary; any retry short and valid."""

    def _first(self, conversation: Sequence[Message], retry: str | None) -> Completion:
        self.retries.append(retry)
        if retry is not None:
            return Completion('negative\n"Short."\nroom:negative', "stop", 100, 20)
        blank = "blank" in conversation[-1]["content"]
        return Completion("\n" * 9 if blank else 'negative\n"Dirty 房', DEAD_END, 100, 9)

    def generate(self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None,
                 retry: str | None = None) -> list[Completion]:
        return [self._first(c, retry) for c in conversations]

    def submit(self, conversation: Sequence[Message], lang: str | None = None, *, retry: str | None = None) -> str:
        rid = f"r{len(self.retries)}"
        self._done.append((rid, self._first(conversation, retry)))
        return rid


@pytest.mark.parametrize("continuous", [True, False])
def test_an_answer_cut_at_a_dead_end_is_written_again_a_blank_loop_as_a_repair(continuous: bool) -> None:
    cache.clear()
    engine = DeadEndLines()
    spec = AnalyzeSpec(engine=EngineConfig(model="fake", batch_size=4, optimistic_min_fit=0.0, continuous=continuous),
                       prompt_version="v13", max_review_tokens=50)
    texts = ["The room was dirty.", "blank: the room was dirty.", "Noisy street.", "blank: noisy."]
    out = pd.concat(list(make_analyze_fn(spec, engine_factory=lambda cfg: engine)(iter([_frame(texts)]))))
    assert out["error"].isna().all() and out["summary"].tolist() == ["Short."] * 4
    # every first attempt once, then each again: the blank ones with the repair's penalty, the others the grammar
    assert engine.retries[:4] == [None] * 4
    assert sorted(engine.retries[4:], key=str) == ["grammar", "grammar", "penalty", "penalty"]
    assert out["tokens_out"].tolist() == [29] * 4  # the cut attempt's tokens counted too
    cache.clear()


def test_the_rule_works_for_an_engine_that_takes_no_weak_reference() -> None:
    from qwenspark.analyze import _optimism

    class Slotted:
        __slots__ = ("model_name",)

    settings = EngineConfig(model="fake", optimistic=True)
    rule = _optimism(Slotted(), settings)  # type: ignore[arg-type]
    assert rule is not None and rule.choose()
    assert _optimism(Slotted(), settings.model_copy(update={"optimistic_min_fit": 0.0})) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("evidence", [False, True])
def test_aspects_the_review_has_no_word_of_are_dropped_when_asked(evidence: bool) -> None:
    """prompt.aspect_evidence: the fake engine names "room" for every review; kept only where the text says room."""
    spec = AnalyzeSpec(engine=EngineConfig(model="fake", batch_size=4), prompt_version="v1", max_review_tokens=500,
                       aspect_evidence=evidence)
    out = analyze_chunk(FakeEngine(), _frame(["The room was lovely.", "Great staff.", "房间很大", "服务好"]), spec)
    named = [[m["aspect"] for m in json.loads(a)] for a in out["aspects"]]
    assert named == ([["room"], [], ["room"], []] if evidence else [["room"]] * 4)
    assert list(out["sentiment"]) == ["positive"] * 4  # only the aspects change


def test_a_summary_the_grammar_stopped_is_stored_ended() -> None:
    """The stored summary of an answer stopped at the summary's bound (v1: the schema's 200) ends at a clause."""
    stopped = ("Dirty room and rude staff, the lift broken for days, " * 4)[:200]

    class Stopped(FakeEngine):
        def generate(self, conversations: Sequence[Sequence[Message]],
                     langs: Sequence[str] | None = None) -> list[Completion]:
            answer = {"sentiment": "negative", "summary": stopped, "aspects": []}
            return [Completion(json.dumps(answer), "stop", 10, 60) for _ in conversations]

    out = analyze_chunk(Stopped(), _frame(["Dirty room and rude staff."]), _spec())
    assert len(stopped) == 200 and not stopped.endswith(",")
    assert out["summary"][0] == stopped[: stopped.rfind(",")] + "…"
