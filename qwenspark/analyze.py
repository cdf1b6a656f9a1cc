"""Executor side: the function mapInPandas runs. Cached engine, fixed-size batches, one row out per row in."""

from __future__ import annotations

import logging
import os
import re
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
from pyspark.accumulators import AccumulatorParam

from qwenspark.batching import rechunk, truncate_by_tokens
from qwenspark.calibrate import calibrated
from qwenspark.config import EngineConfig
from qwenspark.engines import cache
from qwenspark.engines.base import Completion, Engine, Message, Retry, StreamingEngine, Tokenizing, refusal
from qwenspark.engines.dead_ends import DEAD_END
from qwenspark.errors import RequestError
from qwenspark.faults import failpoint
from qwenspark.guard import strip_directives
from qwenspark.label_head import get_head
from qwenspark.optimism import PROBE_EVERY, Optimism
from qwenspark.parse import (
    ENGINE_FAULT,
    Parsed,
    aspects_json,
    ended_summary,
    grammar_misfit,
    needs_repair,
    parse_completion,
)
from qwenspark.prompts import decoded, detect_lang, get_template
from qwenspark.resources import pin_task_gpus, pin_threads
from qwenspark.schemas import EXECUTOR_IN_SCHEMA, RESULT_COLUMNS, ReviewAnalysis
from qwenspark.scoring import borrowed_from

log = logging.getLogger(__name__)

# How many times an answer the engine ended in an error (parse.ENGINE_FAULT) is generated again before its row stores
# the engine's error. One was not enough on an H100 (stop 53): in a run where one engine ended 35 of 3,001 answers so,
# 30 of their second attempts, sent at once, ended so too; the faults came in bursts of consecutive requests.
# With up to 3, each prompt computed afresh, 21 such faults in three runs left no error row (stop 54).
FAULT_RETRIES = 3

EngineFactory = Callable[[EngineConfig], Engine]


class CounterParam(AccumulatorParam[dict[str, int]]):
    """Spark accumulator of string-keyed counts (merged across tasks on the driver)."""

    def zero(self, value: dict[str, int]) -> dict[str, int]:
        return {}

    def addInPlace(self, value1: dict[str, int], value2: dict[str, int]) -> dict[str, int]:
        for key, n in value2.items():
            value1[key] = value1.get(key, 0) + n
        return value1


@dataclass(frozen=True)
class Metrics:
    """Accumulators the executors add to: engine loads per worker pid, batch sizes, rows."""

    engine_loads: Any  # Accumulator[dict[str, int]]: pid -> loads
    batch_sizes: Any  # Accumulator[dict[str, int]]: size -> batches
    rows: Any  # Accumulator[int]
    gpu_bindings: Any  # Accumulator[dict[str, int]]: "pid:gpu addresses" -> engine loads
    engine_rows: Any = None  # Accumulator[dict[str, int]]: "pid:gpu addresses" -> rows analysed
    guarded: Any = None  # Accumulator[int]: reviews the guard cut instructions to the model from
    repaired: Any = None  # Accumulator[int]: answers generated again (any retry kind: engines.base.Retry)

    def release(self) -> None:
        """Drop these accumulators from PySpark's driver registry once their values are read.

        The registry keeps every accumulator of the SparkContext for its whole life and a stream makes a set per
        micro-batch. Released, they take no more updates: PySpark's update server skips unknown ids, and a job's
        successful tasks have all merged theirs by the time the job returns (failed attempts add nothing).
        """
        from pyspark.accumulators import _accumulatorRegistry

        for acc in (self.engine_loads, self.batch_sizes, self.rows, self.gpu_bindings, self.engine_rows,
                    self.guarded, self.repaired):
            if acc is not None:
                _accumulatorRegistry.pop(acc.aid, None)


@dataclass(frozen=True)
class AnalyzeSpec:
    """Everything the executor needs, captured on the driver (picklable: no session, no engine)."""

    engine: EngineConfig
    prompt_version: str
    max_review_tokens: int
    cores: int = 0  # threads each engine gets (0: leave the worker's settings)
    guard: bool = True  # prompt.guard: instructions to the model cut from the review first (qwenspark.guard)
    aspect_evidence: bool = True  # prompt.aspect_evidence: aspects whose words the review lacks are dropped


def make_analyze_fn(
    spec: AnalyzeSpec, metrics: Metrics | None = None, engine_factory: EngineFactory | None = None
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """Build the mapInPandas function on the driver; it runs on executors."""
    template = get_template(spec.prompt_version)  # fail on the driver, not in every task
    if template.label_head is not None:
        get_head(template.label_head)
    no_logprobs = spec.engine.kind in ("transformers", "openai")
    if template.label_head is None and template.label_bias is not None and no_logprobs:
        log.warning("prompt %s is calibrated from label log-probabilities, which engine.kind=%s does not report: "
                    "its labels are stored as generated", spec.prompt_version, spec.engine.kind)

    def analyze_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        _worker_logging()
        engine: Engine | None = None
        optimism: Optimism | None = None
        told = False
        feed: ContinuousFeed | None = None
        done = 0
        where = ""
        try:
            for chunk in rechunk(frames, spec.engine.batch_size):
                if engine is None:
                    # Loaded lazily: an empty partition never loads a model. GPUs and threads are pinned first,
                    # before anything imports torch or vllm.
                    engine, where = _engine_for_task(spec, metrics, engine_factory)
                    optimism = _optimism(engine, templated(spec.engine, spec.prompt_version))
                    if spec.engine.continuous and isinstance(engine, StreamingEngine):
                        feed = ContinuousFeed(engine, spec.engine.max_in_flight or 2 * spec.engine.batch_size)
                if metrics is not None:
                    metrics.batch_sizes.add({str(len(chunk)): 1})
                failpoint("analyze.batch", done)  # executor side, before each batch (the kill tests)
                chosen = optimism.choose() if optimism is not None else None
                if optimism is not None and chosen is False and not told:
                    told = True  # once a task: the rule's state for the user, not a line per batch
                    log.info("optimistic first answers fit %.0f %% of the recent ones (engine.optimistic_min_fit "
                             "%.2f): batches guided from the first token, one in %d still without the grammar",
                             100 * (optimism.share() or 0.0), optimism.min_fit, PROBE_EVERY)
                batch = PreparedBatch(engine, chunk, spec, optimistic=chosen, optimism=optimism)
                if metrics is not None and metrics.guarded is not None and batch.guarded:
                    metrics.guarded.add(len(batch.guarded))
                ready = [(batch, batch.run_sync(engine))] if feed is None else [(b, b.frame()) for b in feed.add(batch)]
                for finished, out in ready:
                    done += len(out)
                    _report(out, done, metrics, where, len(finished.repaired))
                    yield out
            for finished in feed.drain() if feed is not None else []:
                out = finished.frame()
                done += len(out)
                _report(out, done, metrics, where, len(finished.repaired))
                yield out
        finally:
            # A task that fails or is stopped early must not leave requests behind in the cached engine.
            if feed is not None:
                feed.abort()

    return analyze_partition


def templated(cfg: EngineConfig, prompt_version: str) -> EngineConfig:
    """cfg with the guided answer's settings of that prompt version (its few-shot answers follow them)."""
    template = get_template(prompt_version)
    return cfg.model_copy(update={
        "answer_order": template.answer_order,
        "summary_max_chars": template.summary_max_chars,
        "summary_script": template.summary_script,
        "aspect_map": template.aspect_map,
        "answer_format": template.answer_format,
        # A penalty the user set explicitly wins (a measurement of another value); else the version's own.
        "frequency_penalty": cfg.frequency_penalty or template.frequency_penalty,
        "repair_penalty": cfg.repair_penalty if cfg.repair_penalty is not None else template.repair_penalty,
        "optimistic": cfg.optimistic or template.optimistic,
        "label_logprobs": cfg.label_logprobs or template.label_bias is not None
        or (template.label_head is not None and template.head_logprobs),
    })


def _engine_for_task(
    spec: AnalyzeSpec, metrics: Metrics | None, engine_factory: EngineFactory | None
) -> tuple[Engine, str]:
    """The worker's cached engine for this task's GPUs (loaded if needed); returns it and "pid:gpus"."""
    engine_cfg, devices = pin_task_gpus(templated(spec.engine, spec.prompt_version))
    cores: list[int] = []
    if spec.cores:
        engine_cfg, cores = pin_threads(engine_cfg, spec.cores, devices)
    engine, loaded = cache.get_engine(engine_cfg, engine_factory, devices)
    where = f"{os.getpid()}:{','.join(devices) or 'none'}"
    if loaded:
        log.info(
            "engine on GPU(s) [%s], cores [%s], %s threads (pid %d)",
            ",".join(devices), _ranges(cores) or engine_cfg.env.get("VLLM_CPU_OMP_THREADS_BIND", "unbound"),
            engine_cfg.env.get("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "default")),
            os.getpid(),
        )
        if metrics is not None:
            metrics.engine_loads.add({str(os.getpid()): 1})
            metrics.gpu_bindings.add({where: 1})
    return engine, where


# Each engine's share of fitting first answers (engine.optimistic_min_fit), kept for as long as this process keeps the
# engine (engines.cache): its batches across tasks read the same window.
_OPTIMISM: weakref.WeakKeyDictionary[Engine, Optimism] = weakref.WeakKeyDictionary()


def _optimism(engine: Engine, settings: EngineConfig) -> Optimism | None:
    """The rule deciding whether engine's next batch is written optimistically; None for an engine that never is."""
    if not settings.optimistic or settings.optimistic_min_fit <= 0:
        return None
    try:
        if engine not in _OPTIMISM:
            _OPTIMISM[engine] = Optimism(settings.optimistic_min_fit, settings.optimistic_window)
        return _OPTIMISM[engine]
    except TypeError:  # a custom engine that takes no weak reference (__slots__): a share for this task only
        return Optimism(settings.optimistic_min_fit, settings.optimistic_window)


def _ranges(cores: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    spans: list[list[int]] = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)


def _report(out: pd.DataFrame, done: int, metrics: Metrics | None, where: str = "", repaired: int = 0) -> None:
    log.info(
        "batch of %d analysed (%d errors, %d generated tokens, %d generated again); %d rows so far in this task",
        len(out), out["error"].notna().sum(), out["tokens_out"].sum(), repaired, done,
    )
    if metrics is not None:
        metrics.rows.add(len(out))
        if metrics.repaired is not None and repaired:
            metrics.repaired.add(repaired)
        if metrics.engine_rows is not None:
            metrics.engine_rows.add({where: len(out)})


def _worker_logging() -> None:
    # Python workers start with no logging handlers: without one, progress lines would be dropped.
    root = logging.getLogger("qwenspark")
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


class PreparedBatch:
    """One fixed-size batch: prompts built, clean errors kept, result slots waiting to be filled."""

    def __init__(self, engine: Tokenizing, chunk: pd.DataFrame, spec: AnalyzeSpec, *,
                 optimistic: bool | None = None, optimism: Optimism | None = None) -> None:
        missing = [c for c in EXECUTOR_IN_SCHEMA.fieldNames() if c not in chunk.columns]
        if missing:
            raise ValueError(f"analyze stage: input lacks columns {missing}")
        template = get_template(spec.prompt_version)
        self.label_bias, self.aspect_map = template.label_bias, template.aspect_map
        self.answer_format = template.answer_format
        # The engine was built with templated(spec.engine): the same rules decide which answers it generates again.
        settings = templated(spec.engine, spec.prompt_version)
        # optimistic: the engine's first attempts are unguided (default: as the version says; the service decides).
        self.repairs = bool(settings.repair_penalty)
        self.optimistic = settings.optimistic if optimistic is None else optimistic
        # optimism (given for an optimistic engine only): a batch its share of fitting answers sends guided from the
        # first token asks for the grammar's settings, as a retry does; optimistic first attempts feed that share.
        self.first_retry: Retry | None = "grammar" if optimism is not None and not self.optimistic else None
        self.optimism = optimism if self.optimistic else None
        self.summary_rules = (settings.summary_max_chars, settings.summary_script)
        # What a summary must not repeat (engine.borrowed_retry): the few-shot answers' summaries; none when off.
        self.template, self.shown = template, template.example_summaries() if settings.borrowed_retry else ()
        self.repaired: dict[int, Retry] = {}  # conversations generated a second time, and with which settings
        # The model label (and its log-probabilities) of each answer generated again for a borrowed summary: the row
        # keeps it (_borrowed).
        self.kept: dict[int, tuple[str, dict[str, float] | None]] = {}
        self.faults: dict[int, int] = {}  # conversations' answers the engine ended in an error (ENGINE_FAULT) so far
        # Loaded once per process, so a head's file is read on the executor when its first batch arrives.
        self.head = get_head(template.label_head) if template.label_head else None
        self._voted: dict[tuple[int, str], str] = {}  # (row, model label) -> the head's label (_stored_label)
        n = len(chunk)
        self.chunk, self.model, self.prompt_version = chunk, engine.model_name, spec.prompt_version
        self.aspect_evidence = spec.aspect_evidence
        self.sentiment: list[str | None] = [None] * n
        self.generated: list[str | None] = [None] * n  # the label as the model wrote it, before any calibration/head
        self.summary: list[str | None] = [None] * n
        self.aspects: list[str | None] = [None] * n
        self.errors: list[str | None] = [e if isinstance(e, str) else None for e in chunk["clean_error"]]
        self.truncated = [False] * n
        self.tokens_in = [0] * n
        self.tokens_out = [0] * n
        self.langs: list[str] = [""] * n  # the language each prompt was built for (the calibration's key)
        self.texts: list[str] = [""] * n  # the review text each prompt holds (guarded, cut): the label head reads it
        self.label_logprobs: list[dict[str, float] | None] = [None] * n  # as the engine reported them
        self.latency_ms = [0] * n
        self.todo: list[int] = []  # row index of each conversation
        self.conversations: list[list[Message]] = []
        self.guarded: list[int] = []  # row index of each review that had instructions to the model cut
        for i, (raw, lang) in enumerate(zip(chunk["text"], chunk["lang"], strict=True)):
            if self.errors[i] is not None:
                continue
            # As a reader sees it (prompts.decoded): the guard then finds escaped markup too (&lt;instructions&gt;)
            text = decoded(raw)
            if spec.guard:
                guarded = strip_directives(text)
                if guarded.removed:
                    self.guarded.append(i)
                if guarded.empty:
                    self.errors[i] = "empty: nothing left once the instructions to the model are cut"
                    continue
                text = guarded.text
            # Only the engine's refusal of this review is the row's error: a ValueError or TypeError from our own
            # code is a bug and fails the task (it would otherwise become an error row on every row).
            try:
                cut, self.truncated[i] = truncate_by_tokens(text, spec.max_review_tokens, engine.encode, engine.decode)
            except RequestError as exc:
                self.errors[i] = f"prompt: {type(exc).__name__}: {exc}"
                continue
            given = lang if isinstance(lang, str) else None
            self.langs[i] = detect_lang(cut, given)
            self.texts[i] = cut
            self.conversations.append(template.messages(cut, self.langs[i]))
            self.todo.append(i)
        self.remaining = len(self.todo)
        if self.guarded:
            # The ids, not the text: the log must not carry review content (it may hold personal data).
            ids = [str(chunk["review_id"].iat[i]) for i in self.guarded[:20]]
            log.warning("instructions to the model cut from %d review(s) before analysis: review_id %s%s",
                        len(self.guarded), ", ".join(ids), " ..." if len(self.guarded) > 20 else "")

    def fill(self, j: int, done: Completion | str, latency_ms: int) -> Retry | None:
        """Store the answer (or engine error) of conversation j; or, storing nothing, return how to generate it
        again: "grammar" for an answer written without the grammar (optimistic) that does not fit it, "penalty" for
        one cut or looping when the prompt version repairs those (once: the second answer is stored whatever it is);
        "fault" for one the engine ended in an error (parse.ENGINE_FAULT), up to FAULT_RETRIES times; "borrowed" for
        one whose summary repeats a few-shot example's (once, its prompt rebuilt without that example; the row keeps the
        first answer's label)."""
        i = self.todo[j]
        parsed = None if isinstance(done, str) else parse_completion(
            done.text, done.finish_reason, self.aspect_map, self.answer_format)
        if isinstance(done, Completion) and parsed is not None:
            retry = self._retry(j, done, parsed, self.langs[i])
            if retry is not None:
                self.repaired.setdefault(j, retry)
                self.tokens_out[i] += done.tokens_out  # the earlier answers' tokens were spent too
                return retry
        self.latency_ms[i] = latency_ms
        self.remaining -= 1
        if isinstance(done, str) or parsed is None:
            self.errors[i] = str(done)
            return None
        self.tokens_in[i] = done.tokens_in
        self.tokens_out[i] += done.tokens_out
        if parsed.record is None:
            self.label_logprobs[i] = done.label_logprobs
            self.errors[i] = parsed.error
        else:
            answer, logprobs = self.kept.get(j, (parsed.record.sentiment, done.label_logprobs))
            self.label_logprobs[i], self.generated[i] = logprobs, answer
            self.sentiment[i] = self._stored_label(i, answer, logprobs)
            self.summary[i] = ended_summary(parsed.record.summary, self.summary_rules[0], self.langs[i])
            self.aspects[i] = aspects_json(parsed.record, self.texts[i] if self.aspect_evidence else None)
        return None

    def early_answer(self, text: str) -> str | None:
        """The model's label in its answer so far (the label is the answer's first field): None until its value has
        closed."""
        found = _EARLY_LABEL[self.answer_format].match(text)
        return None if found is None else found.group(1)

    def early_label(self, j: int, answer: str, label_logprobs: dict[str, float] | None) -> str:
        """The label conversation j will be stored with for the model's label found by early_answer (through the label
        head or calibration). The service sends it before the rest is decoded."""
        return self._stored_label(self.todo[j], answer, label_logprobs)

    def _stored_label(self, i: int, answer: str, label_logprobs: dict[str, float] | None) -> str:
        """The label row i is stored with for the model's answer: the label head's, or the calibrated answer. A head
        that votes with the answer alone is asked once per row and answer (the service asks for the early label and
        again at the end; its hashed n-grams are most of a review's Python time there)."""
        if self.head is None:
            bias = self.label_bias.get(self.langs[i]) if self.label_bias else None
            return calibrated(answer, label_logprobs, bias)
        if label_logprobs is not None:
            return self.head.label(answer, label_logprobs, self.texts[i], self.langs[i])
        if (i, answer) not in self._voted:
            self._voted[i, answer] = self.head.label(answer, None, self.texts[i], self.langs[i])
        return self._voted[i, answer]

    def keep_label(self, j: int, sentiment: str) -> None:
        """Store conversation j (answered) with the label the service already sent for it, unless it ended as an
        error row: its retry was pinned to the same model label (answer_grammars' label), and this settles what the
        head's other inputs (label log-probabilities of a second attempt) could still change."""
        i = self.todo[j]
        if self.errors[i] is None and self.sentiment[i] is not None:
            self.sentiment[i] = sentiment

    def _retry(self, j: int, done: Completion, parsed: Parsed, lang: str) -> Retry | None:
        if done.finish_reason == ENGINE_FAULT:  # the engine's doing, not the model's: the same prompt again
            self.faults[j] = self.faults.get(j, 0) + 1
            return "fault" if self.faults[j] <= FAULT_RETRIES else None
        if j in self.repaired:  # a second answer, stored whatever it is
            return None
        retry = self._repair(done, parsed, lang)
        if self.optimism is not None:  # a first answer: whether it fits (an engine's fault says nothing of that)
            self.optimism.record(retry is None)
        if retry is None and parsed.record is not None:
            return self._borrowed(j, parsed.record, done.label_logprobs)
        return retry

    def _borrowed(self, j: int, record: ReviewAnalysis, label_logprobs: dict[str, float] | None) -> Retry | None:
        """"borrowed" for a summary that repeats a few-shot example's (scoring.borrowed_from), conversation j's prompt
        rebuilt without that example (the default 0.5B copied the example's summary and aspects whole: README,
        "Summary borrowed"); else None. The row keeps this answer's label: the label head was fitted on the whole
        prompt's log-probabilities, and the service has sent it already."""
        i = self.todo[j]
        # the summary as it would be stored: a clause the grammar's bound cut is not (ended_summary)
        k = borrowed_from(ended_summary(record.summary, self.summary_rules[0], self.langs[i]), self.texts[i],
                          self.shown)
        if k is None:
            return None
        self.conversations[j] = self.template.messages(self.texts[i], self.langs[i], leave_out=(k,))
        self.kept[j] = (record.sentiment, label_logprobs)
        return "borrowed"

    def _repair(self, done: Completion, parsed: Parsed, lang: str) -> Retry | None:
        if self.optimistic and done.finish_reason == DEAD_END:  # the engine ended it where no answer could fit
            # Only blanks (parse.LEADING_BLANKS): the loop max_tokens would have cut, repaired as such.
            return "penalty" if self.repairs and not done.text.strip() else "grammar"
        if self.repairs and needs_repair(done.finish_reason, parsed):
            return "penalty"
        # optimistic: anything else unfit gets the grammar, except a refusal for the content ("error: ..."), which
        # would be refused again.
        refused = (done.finish_reason or "").startswith("error:")
        if self.optimistic and not refused and (
                parsed.record is None or grammar_misfit(parsed.record, lang, *self.summary_rules) is not None):
            return "grammar"
        return None

    def run_sync(self, engine: Engine) -> pd.DataFrame:
        """One synchronous engine call for the whole batch (engines without a continuous feed)."""
        started = time.perf_counter()
        langs = [self.langs[i] for i in self.todo]
        completions = generate_isolating(engine, self.conversations, langs, retry=self.first_retry)
        answers = list(enumerate(completions))
        while answers:  # rounds of second attempts until every answer is stored (fill bounds the retries)
            batch_ms = int((time.perf_counter() - started) * 1000)
            again: dict[Retry, list[int]] = {}
            for j, done in answers:
                retry = self.fill(j, done, batch_ms)
                if retry is not None:
                    again.setdefault(retry, []).append(j)
            answers = []
            for retry, rows in again.items():
                log.info("%d answer(s) generated again (%s)", len(rows), retry)
                redone = generate_isolating(engine, [self.conversations[j] for j in rows], [langs[j] for j in rows],
                                            retry=retry)
                answers.extend(zip(rows, redone, strict=True))
        return self.frame()

    def _columns(self) -> dict[str, Any]:
        """The result columns, each a sequence of one value per input row (model, prompt_version, analysed_at: one
        value for all)."""
        chunk = self.chunk
        return {
            "review_id": chunk["review_id"].astype("int64").to_numpy(),
            "hotel_id": chunk["hotel_id"].to_numpy(),
            "review_created_at": chunk["created_at"].to_numpy(),  # passed through as it came
            "lang": chunk["lang"].to_numpy(),
            "input_key": chunk["input_key"].to_numpy(),
            "sentiment": self.sentiment,
            "summary": self.summary,
            "aspects": self.aspects,
            "truncated": self.truncated,
            "error": self.errors,
            "model": self.model,
            "prompt_version": self.prompt_version,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "latency_ms": self.latency_ms,
            "analysed_at": _now_micros(),
        }

    def _answered(self, rows: int) -> None:
        if rows != len(self.chunk) or self.remaining:  # the contract this whole module exists for
            raise AssertionError(f"analyze stage: {len(self.chunk)} rows in, {rows} out, {self.remaining} unanswered")

    def frame(self) -> pd.DataFrame:
        """The result rows, one per input row, in input order (EXECUTOR_OUT_SCHEMA: timestamps as microseconds)."""
        columns = self._columns()
        for name in ("tokens_in", "tokens_out", "latency_ms"):
            columns[name] = pd.array(columns[name], dtype="int32")
        out = pd.DataFrame(columns, columns=list(RESULT_COLUMNS))
        self._answered(len(out))
        return out

    def records(self) -> list[dict[str, Any]]:
        """frame()'s rows as dicts of plain Python values, without building a DataFrame (the service answers a
        request from these: pandas cost it 1.7 ms a review)."""
        columns = self._columns()
        rows = len(self.chunk)
        for name in ("model", "prompt_version", "analysed_at"):
            columns[name] = [columns[name]] * rows
        lists = {name: (v.tolist() if hasattr(v, "tolist") else list(v)) for name, v in columns.items()}
        # NaN is how pandas holds a missing value in a float column (a review without created_at): None here.
        out = [{name: None if (v := lists[name][i]) != v else v for name in RESULT_COLUMNS} for i in range(rows)]
        self._answered(len(out))
        return out


# The start of a verdict-first answer once its label has closed (guided output has no whitespace), by answer format.
_EARLY_LABEL: dict[str, re.Pattern[str]] = {
    "json": re.compile(r'\s*\{\s*"sentiment"\s*:\s*"(positive|negative|neutral|mixed)"'),
    "lines": re.compile(r"\s*(positive|negative|neutral|mixed)\n"),
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _now_micros() -> int:
    """Now, in microseconds since the epoch (exact, whatever the worker's time zone)."""
    return (datetime.now(UTC) - _EPOCH) // timedelta(microseconds=1)


def analyze_chunk(engine: Engine, chunk: pd.DataFrame, spec: AnalyzeSpec) -> pd.DataFrame:
    """Analyse one batch synchronously. Returns exactly one result row per input row, in order."""
    return PreparedBatch(engine, chunk, spec).run_sync(engine)


class ContinuousFeed:
    """Keeps the engine busy across batches: new requests join while earlier ones still decode.

    The naive way (generate one batch, wait for its longest answer, then the next) idles the engine's
    batch slots while the last sequences finish. Here a batch's requests are added as soon as it arrives, then
    the engine is stepped until at most `max_in_flight` are outstanding (so up to `max_in_flight` plus one batch
    while a batch is added: bounding memory and latency), and finished batches are handed back strictly in input
    order, so the one-row-out-per-row-in contract and row order hold.
    """

    def __init__(self, engine: StreamingEngine, max_in_flight: int) -> None:
        self.engine, self.max_in_flight = engine, max_in_flight
        self.pending: deque[PreparedBatch] = deque()
        self.owner: dict[str, tuple[PreparedBatch, int, float]] = {}

    def add(self, batch: PreparedBatch) -> list[PreparedBatch]:
        """Submit a batch; step the engine while too much is in flight; return batches now complete, in order."""
        self.pending.append(batch)
        for j in range(len(batch.conversations)):
            self._submit(batch, j, time.perf_counter(), batch.first_retry)
        while len(self.owner) > self.max_in_flight:
            self._step()
        return self._complete_head()

    def drain(self) -> list[PreparedBatch]:
        """Finish everything still in flight (end of the partition)."""
        while self.owner:
            self._step()
        return self._complete_head()

    def abort(self) -> None:
        """Drop this feed's outstanding requests from the engine."""
        if self.owner:
            self.engine.abort(list(self.owner))
            self.owner.clear()

    def _submit(self, batch: PreparedBatch, j: int, started: float, retry: Retry | None = None) -> None:
        lang = batch.langs[batch.todo[j]]
        try:
            # retry only as a keyword when set: engines without retry settings never see it.
            rid = (self.engine.submit(batch.conversations[j], lang, retry=retry) if retry is not None
                   else self.engine.submit(batch.conversations[j], lang))
        except RequestError as exc:  # refused at admission: that row's error, not the task's
            batch.fill(j, refusal(exc), 0)
            return
        self.owner[rid] = (batch, j, started)

    def _step(self) -> None:
        for rid, done in self.engine.step():
            owner = self.owner.pop(rid, None)
            if owner is None:  # left over from an earlier task that ended early: nobody waits for it
                continue
            batch, j, started = owner
            retry = batch.fill(j, done, int((time.perf_counter() - started) * 1000))
            if retry is not None:
                self._submit(batch, j, started, retry)

    def _complete_head(self) -> list[PreparedBatch]:
        out = []
        while self.pending and self.pending[0].remaining == 0:
            out.append(self.pending.popleft())
        return out


def generate_isolating(
    engine: Engine, conversations: Sequence[list[Message]], langs: Sequence[str] | None = None, *,
    retry: Retry | None = None,
) -> list[Completion | str]:
    """engine.generate on the batch; if the engine refuses a request, retry one by one to find it.

    A refusal (RequestError, e.g. a prompt longer than the context) becomes that row's error string. Any other
    exception, a ValueError or TypeError of a bug included, is a failure: it propagates and fails the task (Spark
    retries it) instead of turning every row into an error row.
    """
    if not conversations:
        return []
    options = {"retry": retry} if retry is not None else {}  # engines without retry settings never see the keyword
    try:
        return list(engine.generate(conversations, langs, **options))
    except RequestError as exc:
        log.warning("engine refused a batch of %d (%s); isolating the bad rows", len(conversations), exc)
    results: list[Completion | str] = []
    for j, conv in enumerate(conversations):
        try:
            results.extend(engine.generate([conv], None if langs is None else [langs[j]], **options))
        except RequestError as exc:
            results.append(refusal(exc))
    return results
