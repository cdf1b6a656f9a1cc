"""A deterministic test engine (engine.kind=custom): keyword labels, GPU-like decode time, a record of every call.

Used where the model is not the point (scheduling, staging, reconciliation): fast, and its records are written
by the test double, not by the code under test, so tests can check which engine did what from the outside.

engine_kwargs: seconds_per_token (decode time of one token for the whole batch, as on a GPU, where a batch
takes as long as its longest answer), min_tokens / max_tokens (answer lengths, varied per review),
record_dir (one JSON-lines file per process: load, call, close events; also $QWENSPARK_ECHO_RECORDS),
garble (a word: a review holding it gets an answer that is not JSON, as a broken model's would be), down (true:
every call raises EngineError, as an engine whose server or device is gone).
Inside a Spark task, load and call records also hold the task: stage, partition, attempt (its attempt number) and
task (Spark's task attempt id); outside one they are null. A call record also counts the reviews of the call without
content (no_content: no letter, digit or symbol, tests/support/hostile.py:has_content; the job should have flagged
them `empty:` without the model), the prompts without a <review> block (unframed: the labels then read the whole
prompt) and the review language the caller gave each request (langs, None when it gave none).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message
from qwenspark.errors import EngineError
from tests.support.char_tokens import CharTokens
from tests.support.hostile import has_content

NEGATIVE = ("dirty", "rude", "broken", "cold", "noisy", "filthy", "差", "吵", "脏", "不好")
REVIEW = re.compile(r"<review>\n(.*)\n</review>", re.S)


def read_records(folder: Path, event: str | None = None) -> list[dict[str, Any]]:
    """The records every process wrote under folder (only those of one event kind if given), file by file."""
    found = []
    for path in sorted(folder.glob("echo-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if event is None or record["event"] == event:
                found.append(record)
    return found


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """Most intervals open at one instant (e.g. engine calls in flight at once)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def build(cfg: EngineConfig) -> EchoEngine:
    """engine.factory entry point."""
    return EchoEngine(cfg)


def task_fields() -> dict[str, int | None]:
    """The Spark task this process is running (stage, partition, attempt, task attempt id), or nulls."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except Exception:  # no pyspark, or not in a task: the record just lacks the task
        ctx = None
    if ctx is None:
        return {"stage": None, "partition": None, "attempt": None, "task": None}
    return {"stage": ctx.stageId(), "partition": ctx.partitionId(), "attempt": ctx.attemptNumber(),
            "task": ctx.taskAttemptId()}


def answer_length(text: str, lo: int, hi: int) -> int:
    """A deterministic answer length in [lo, hi] for a review (varied, like real answers)."""
    if hi <= lo:
        return lo
    return lo + int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % (hi - lo + 1)


class EchoEngine(CharTokens):
    """Answers valid JSON from keywords; sleeps seconds_per_token x the batch's longest answer."""

    def __init__(self, cfg: EngineConfig) -> None:
        os.environ.update(cfg.env)
        kw: dict[str, Any] = dict(cfg.engine_kwargs)
        self.model_name = cfg.model
        self.seconds_per_token = float(kw.get("seconds_per_token", 0.0))
        self.min_tokens, self.max_tokens = int(kw.get("min_tokens", 20)), int(kw.get("max_tokens", 80))
        folder = kw.get("record_dir") or os.environ.get("QWENSPARK_ECHO_RECORDS")
        self.records = Path(folder) / f"echo-{os.getpid()}.jsonl" if folder else None
        self.devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.garble = str(kw["garble"]) if kw.get("garble") else None
        self.down = bool(kw.get("down"))
        self.aspect_map = cfg.aspect_map  # answer in the prompt version's form (engine.aspect_map)
        self._record(event="load", threads=os.environ.get("OMP_NUM_THREADS"),
                     bind=os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), **task_fields())

    def _record(self, **fields: Any) -> None:
        if self.records is None:
            return
        self.records.parent.mkdir(parents=True, exist_ok=True)
        with self.records.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"pid": os.getpid(), "devices": self.devices, "t": time.time(), **fields}) + "\n")

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: str | None = None,
    ) -> list[Completion]:
        if self.down:
            self._record(event="down", rows=len(conversations), **task_fields())
            raise EngineError("echo engine: down (engine_kwargs.down)")
        started = time.time()
        out, lengths, texts = [], [], []
        unframed = 0
        for conversation in conversations:
            prompt = conversation[-1]["content"]
            found = REVIEW.search(prompt)
            unframed += found is None
            text = found.group(1) if found else prompt
            negative = any(word in text.lower() for word in NEGATIVE)
            answer = {
                "sentiment": "negative" if negative else "positive",
                "summary": text.strip()[:60] or "-",
                "aspects": [{"aspect": "service", "sentiment": "negative" if negative else "positive"}],
            }
            if self.aspect_map:
                answer["aspects"] = {"service": "negative" if negative else "positive"}
            n = answer_length(text, self.min_tokens, self.max_tokens)
            lengths.append(n)
            texts.append(text)
            garbled = self.garble is not None and self.garble in text
            body = "I cannot answer that." if garbled else json.dumps(answer, ensure_ascii=False)
            out.append(Completion(body, "stop", len(prompt), n))
        if self.seconds_per_token and lengths:
            time.sleep(self.seconds_per_token * max(lengths))
        self._record(event="call", start=started, end=time.time(), rows=len(out),
                     keys=[hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest()[:12] for t in texts],
                     no_content=sum(not has_content(t) for t in texts), unframed=unframed,
                     langs=list(langs) if langs is not None else None, retry=retry,
                     **task_fields())
        return out

    def close(self) -> None:
        self._record(event="close")
