"""`qwenspark serve` on dummy weights with answers as long as real ones (GPU machine only, for bench/serve_latency.py).

A dummy-weight model under the grammar rarely closes its JSON, so every answer would run to max_tokens and measure a
worst case no user sees. Here each request's max_tokens is drawn, in order of arrival, from the output-token
percentiles of a real CPU eval, as bench/workload_100k.py does for the batch. Everything else is the product's path.

With an optimistic prompt version (serve.optimistic), dummy weights write no valid answer without the grammar either.
QWENSPARK_BENCH_UNGUIDED_VALID=SHARE then plays a trained model's first attempts, as workload_100k.ValidShare does
for the batch: each first attempt reads as its label line from its first token on ("positive"), and ends as a
canned valid answer for SHARE of the requests (seeded by arrival) or as that label line followed by the dummy text
(a misfit: the service generates it again with the grammar, pinned to the label it sent), with the tokens and time
the engine really spent on it.

QWENSPARK_BENCH_GC_FREEZE=0 leaves the service's heap unfrozen (the collector's pauses, compared in one sitting);
QWENSPARK_BENCH_UVLOOP=0 runs it on Python's own event loop instead of uvloop's.

QWENSPARK_BENCH_INSTANT=1 has the engine answer every request at once with a valid canned answer, its label token by
token first as vLLM would report it (AsyncVllm.steps, so also behind serve.workers' shared engine): what remains is
the service's own work per request, every part of it but the model (its capacity, on any machine).

    [QWENSPARK_BENCH_UNGUIDED_VALID=0.95] python3 bench/device/serve_planned.py EVAL.json serve --config F [--set ...]
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import json
import os
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workload_100k import ValidShare, draw_lengths
from qwenspark import cli
from qwenspark.serve import app
from qwenspark.serve import engine as serve_engine
from qwenspark.serve.shared import SharedVllm


class PlannedParams(dict[Any, Any]):
    """The engine's sampling params by (lang, retry); each lookup through get() is a copy with the next length."""

    def __init__(self, params: dict[Any, Any], lengths: list[int]) -> None:
        super().__init__(params)
        self._lengths = itertools.cycle(lengths)

    def get(self, key: Any, default: Any = None) -> Any:
        params = super().get(key, default).clone()
        params.max_tokens = next(self._lengths)
        return params


def unguided_valid(engine: serve_engine.ServeEngine, share: float, answer_format: str) -> None:
    """First attempts (no grammar) read as a trained model's: its label line at once, and valid for `share`."""
    stream, arrivals = engine.stream, itertools.count()
    answers = ValidShare.ANSWER[answer_format]

    async def played(conversation: Any, lang: str | None, retry: Any = None, pin: str | None = None
                     ) -> AsyncIterator[serve_engine.Partial]:
        if retry is not None:
            async for part in stream(conversation, lang, retry, pin):
                yield part
            return
        fits = random.Random(f"valid{next(arrivals)}").random() < share
        answer = answers.get(lang or "en", answers["en"])
        label = answer.split("\n", 1)[0] + "\n" if answer_format == "lines" else answer.split(",", 1)[0]
        async for part in stream(conversation, lang, retry, pin):
            if part.done is None:
                yield serve_engine.Partial(label)
            else:
                text = answer if fits else label + part.done.text
                yield serve_engine.Partial(text, None, dataclasses.replace(part.done, text=text, finish_reason="stop"))

    engine.stream = played  # type: ignore[method-assign]


async def instant_steps(engine: serve_engine.AsyncVllm, ids: list[int], lang: str | None, retry: Any = None,
                        pin: str | None = None) -> AsyncIterator[serve_engine.Step]:
    """AsyncVllm.steps without the model: ValidShare's canned answer for the language, its first tokens one by one."""
    fmt = engine._cfg.answer_format if engine._cfg is not None else "json"
    answer = engine.prompts.encode(ValidShare.ANSWER[fmt].get(lang or "en", ValidShare.ANSWER[fmt]["en"]))
    for n in range(1, min(len(answer), serve_engine.EARLY_TOKENS) + 1):
        await asyncio.sleep(0)  # one report per engine step, the event loop free between them
        yield serve_engine.Step(answer[:n])
    yield serve_engine.Step(answer, finish_reason="stop", tokens_in=len(ids), finished=True)


def install(lengths_from: str) -> None:
    """Patch AsyncVllm.start in this process: planned lengths, and QWENSPARK_BENCH_UNGUIDED_VALID's first attempts."""
    table = json.loads(Path(lengths_from).read_text())["tokens_out_percentiles"]
    lengths = draw_lengths(table, 100_000, cap=256)
    start = serve_engine.AsyncVllm.start.__func__  # type: ignore[attr-defined]
    share = os.environ.get("QWENSPARK_BENCH_UNGUIDED_VALID")

    async def planned_start(cls: type[serve_engine.AsyncVllm], cfg: Any) -> serve_engine.AsyncVllm:
        engine = await start(cls, cfg)
        engine._params = PlannedParams(engine._params, lengths)
        if share is not None and cfg.optimistic:
            unguided_valid(engine, float(share), cfg.answer_format)
        return engine

    serve_engine.AsyncVllm.start = classmethod(planned_start)  # type: ignore[assignment,method-assign]
    if os.environ.get("QWENSPARK_BENCH_UVLOOP") == "0":  # Python's own event loop (A/B)
        app.loop_factory = lambda: None
    if os.environ.get("QWENSPARK_BENCH_INSTANT") == "1":
        serve_engine.AsyncVllm.steps = instant_steps  # type: ignore[method-assign,assignment]
    if share is not None:  # serve.workers sharing one engine: the first attempts are played in each service process

        init = app.Service.__init__

        def played_init(service: app.Service, cfg: Any, engine: Any, *args: Any, **kwargs: Any) -> None:
            init(service, cfg, engine, *args, **kwargs)
            settings = app.serve_engine_config(cfg)
            if isinstance(engine, SharedVllm) and settings.optimistic:
                unguided_valid(engine, float(share), settings.answer_format)

        app.Service.__init__ = played_init  # type: ignore[method-assign,assignment]
    if os.environ.get("QWENSPARK_BENCH_GC_FREEZE") == "0":  # the service as it was before it froze its heap (A/B)
        gc.freeze = lambda: None


def main() -> int:
    os.environ[_LENGTHS] = sys.argv[1]  # for serve.workers' processes, which import this file as __mp_main__
    install(sys.argv[1])
    return cli.main(sys.argv[2:])


_LENGTHS = "QWENSPARK_BENCH_LENGTHS_FROM"
if __name__ == "__mp_main__" and os.environ.get(_LENGTHS):  # a serve.workers process (spawned from main's)
    install(os.environ[_LENGTHS])

if __name__ == "__main__":
    sys.exit(main())
