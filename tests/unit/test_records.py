"""PreparedBatch.records (the service's rows, without pandas) holds what frame() holds, row for row."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from qwenspark.analyze import AnalyzeSpec, PreparedBatch
from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion
from qwenspark.schemas import CLEAN_SCHEMA, RESULT_COLUMNS


class Chars:
    model_name = "fake"

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def _plain(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def test_records_are_frame_rows_with_plain_values() -> None:
    chunk = pd.DataFrame({
        "review_id": [9_223_372_036_854_775_807, 2, 3], "hotel_id": ["H1", None, "H3"],
        "created_at": [253_402_214_400_000_000, None, 0], "lang": ["en", "zh", None],
        "text": ["Lovely staff, noisy street.", "房间太脏", None], "input_key": ["a", "b", "c"],
        "clean_error": [None, None, "empty: no text"],
    }, columns=CLEAN_SCHEMA.fieldNames())
    spec = AnalyzeSpec(engine=EngineConfig(model="fake"), prompt_version="v13", max_review_tokens=10_000)
    batch = PreparedBatch(Chars(), chunk, spec, optimistic=False)  # type: ignore[arg-type]
    assert batch.fill(0, Completion('positive\n"Kind staff, noisy street."\nservice:positive', "stop", 50, 12), 7) \
        is None
    assert batch.fill(1, "error: engine refused", 9) is None
    records, frame = batch.records(), batch.frame()
    assert len(records) == 3 and [list(r) for r in records] == [list(RESULT_COLUMNS)] * 3
    for record, row in zip(records, frame.to_dict("records"), strict=True):
        assert record == {k: _plain(v) for k, v in row.items()} | {"analysed_at": record["analysed_at"]}
    assert records[0]["review_id"] == 9_223_372_036_854_775_807 and type(records[0]["tokens_out"]) is int
    assert records[0]["sentiment"] in ("positive", "negative", "neutral", "mixed") and records[0]["error"] is None
    assert records[1]["error"] == "error: engine refused" and records[2]["error"] == "empty: no text"
