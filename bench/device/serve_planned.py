"""`qwenspark serve` on dummy weights with answers as long as real ones (GPU machine only, for bench/serve_latency.py).

A dummy-weight model under the grammar rarely closes its JSON, so every answer would run to max_tokens and measure a
worst case no user sees. Here each request's max_tokens is drawn, in order of arrival, from the output-token
percentiles of a real CPU eval, as bench/workload_100k.py does for the batch. Everything else is the product's path.

    python3 bench/device/serve_planned.py EVAL.json serve --config F [--set KEY=VALUE ...]
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.workload_100k import draw_lengths
from qwenspark import cli
from qwenspark.serve import engine as serve_engine


class PlannedParams(dict[Any, Any]):
    """The engine's sampling params by (lang, retry); each lookup through get() is a copy with the next length."""

    def __init__(self, params: dict[Any, Any], lengths: list[int]) -> None:
        super().__init__(params)
        self._lengths = itertools.cycle(lengths)

    def get(self, key: Any, default: Any = None) -> Any:
        params = super().get(key, default).clone()
        params.max_tokens = next(self._lengths)
        return params


def main() -> int:
    table = json.loads(Path(sys.argv[1]).read_text())["tokens_out_percentiles"]
    lengths = draw_lengths(table, 100_000, cap=256)
    start = serve_engine.AsyncVllm.start.__func__  # type: ignore[attr-defined]

    async def planned_start(cls: type[serve_engine.AsyncVllm], cfg: Any) -> serve_engine.AsyncVllm:
        engine = await start(cls, cfg)
        engine._params = PlannedParams(engine._params, lengths)
        return engine

    serve_engine.AsyncVllm.start = classmethod(planned_start)  # type: ignore[assignment,method-assign]
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
