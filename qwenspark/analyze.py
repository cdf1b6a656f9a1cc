"""Executor side: the function mapInPandas runs. Cached engine, fixed-size batches, one row out per row in."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from pyspark.accumulators import AccumulatorParam

from qwenspark.batching import rechunk, truncate_by_tokens
from qwenspark.config import EngineConfig
from qwenspark.engines import cache
from qwenspark.engines.base import Completion, Engine, Message
from qwenspark.parse import aspects_json, parse_completion
from qwenspark.prompts import detect_lang, get_template
from qwenspark.resources import pin_task_gpus
from qwenspark.schemas import CLEAN_SCHEMA, RESULT_COLUMNS

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class AnalyzeSpec:
    """Everything the executor needs, captured on the driver (picklable: no session, no engine)."""

    engine: EngineConfig
    prompt_version: str
    max_review_tokens: int


def make_analyze_fn(
    spec: AnalyzeSpec, metrics: Metrics | None = None, engine_factory: EngineFactory | None = None
) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
    """Build the mapInPandas function on the driver; it runs on executors."""
    get_template(spec.prompt_version)  # fail on the driver, not in every task

    def analyze_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        _worker_logging()
        engine: Engine | None = None
        done = 0
        for chunk in rechunk(frames, spec.engine.batch_size):
            if engine is None:
                # Loaded lazily: an empty partition never loads a model. GPUs are pinned first, before
                # anything imports torch or vllm.
                engine_cfg, gpus = pin_task_gpus(spec.engine)
                engine, loaded = cache.get_engine(engine_cfg, engine_factory)
                if metrics is not None and loaded:
                    metrics.engine_loads.add({str(os.getpid()): 1})
                    metrics.gpu_bindings.add({f"{os.getpid()}:{','.join(gpus) or 'none'}": 1})
            started = time.perf_counter()
            out = analyze_chunk(engine, chunk, spec)
            done += len(out)
            log.info(
                "batch of %d analysed in %.1f s (%d errors, %d generated tokens); %d rows so far in this task",
                len(out), time.perf_counter() - started, out["error"].notna().sum(), out["tokens_out"].sum(), done,
            )
            if metrics is not None:
                metrics.batch_sizes.add({str(len(chunk)): 1})
                metrics.rows.add(len(out))
            yield out

    return analyze_partition


def _worker_logging() -> None:
    # Python workers start with no logging handlers: without one, progress lines would be dropped.
    root = logging.getLogger("qwenspark")
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def analyze_chunk(engine: Engine, chunk: pd.DataFrame, spec: AnalyzeSpec) -> pd.DataFrame:
    """Analyse one batch. Returns exactly one result row per input row, in order."""
    missing = [c for c in CLEAN_SCHEMA.fieldNames() if c not in chunk.columns]
    if missing:
        raise ValueError(f"analyze stage: input lacks columns {missing}")
    template = get_template(spec.prompt_version)
    n = len(chunk)
    sentiment: list[str | None] = [None] * n
    summary: list[str | None] = [None] * n
    aspects: list[str | None] = [None] * n
    errors: list[str | None] = [e if isinstance(e, str) else None for e in chunk["clean_error"]]
    truncated = [False] * n
    tokens_in = [0] * n
    tokens_out = [0] * n

    todo: list[int] = []
    conversations: list[list[Message]] = []
    for i, (text, lang) in enumerate(zip(chunk["text"], chunk["lang"], strict=True)):
        if errors[i] is not None:
            continue
        try:
            cut, truncated[i] = truncate_by_tokens(text, spec.max_review_tokens, engine.encode, engine.decode)
            conversations.append(template.messages(cut, detect_lang(cut, lang if isinstance(lang, str) else None)))
            todo.append(i)
        except (ValueError, TypeError, UnicodeError) as exc:
            errors[i] = f"prompt: {type(exc).__name__}: {exc}"

    started = time.perf_counter()
    completions = generate_isolating(engine, conversations)
    batch_ms = int((time.perf_counter() - started) * 1000)
    latency = [0] * n
    for i in todo:
        latency[i] = batch_ms

    for i, done in zip(todo, completions, strict=True):
        if isinstance(done, str):
            errors[i] = done
            continue
        tokens_in[i], tokens_out[i] = done.tokens_in, done.tokens_out
        parsed = parse_completion(done.text, done.finish_reason)
        if parsed.record is None:
            errors[i] = parsed.error
        else:
            sentiment[i] = parsed.record.sentiment
            summary[i] = parsed.record.summary
            aspects[i] = aspects_json(parsed.record)

    out = pd.DataFrame(
        {
            "review_id": chunk["review_id"].astype("int64").to_numpy(),
            "hotel_id": chunk["hotel_id"].to_numpy(),
            "review_created_at": chunk["created_at"].to_numpy(),
            "lang": chunk["lang"].to_numpy(),
            "input_key": chunk["input_key"].to_numpy(),
            "sentiment": sentiment,
            "summary": summary,
            "aspects": aspects,
            "truncated": truncated,
            "error": errors,
            "model": engine.model_name,
            "prompt_version": spec.prompt_version,
            "tokens_in": pd.array(tokens_in, dtype="int32"),
            "tokens_out": pd.array(tokens_out, dtype="int32"),
            "latency_ms": pd.array(latency, dtype="int32"),
            "analysed_at": pd.Timestamp(datetime.now(UTC).replace(tzinfo=None)),
        },
        columns=list(RESULT_COLUMNS),
    )
    if len(out) != n:  # the contract this whole module exists for
        raise AssertionError(f"analyze stage: {n} rows in, {len(out)} out")
    return out


def generate_isolating(engine: Engine, conversations: Sequence[list[Message]]) -> list[Completion | str]:
    """engine.generate on the batch; if the engine refuses a request, retry one by one to find it.

    A refusal (ValueError/TypeError, e.g. a prompt longer than the context) becomes that row's error
    string. Any other exception is the engine failing: it propagates and fails the task (Spark retries).
    """
    if not conversations:
        return []
    try:
        return list(engine.generate(conversations))
    except (ValueError, TypeError) as exc:
        log.warning("engine refused a batch of %d (%s); isolating the bad rows", len(conversations), exc)
    results: list[Completion | str] = []
    for conv in conversations:
        try:
            results.extend(engine.generate([conv]))
        except (ValueError, TypeError) as exc:
            results.append(f"engine refused the request: {str(exc)[:500]}")
    return results
