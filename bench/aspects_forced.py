"""Aspects decided by the review's words, their sentiments by the model: an experiment, not the product's path.

The default 0.5B names aspects poorly (README "Aspect quality": F1 0.71 as it names them, 0.82 kept to the review's cue
words, and never cleanliness), while the cue words alone find them with F1 0.90, but carry no sentiment. Here each
marked review is answered twice by the real model through vLLM with the product's v10 prompt and grammar: once as
the product asks (any aspects), and once with a grammar whose aspects are exactly the ones the review has cue words
of (`qwenspark.aspect_evidence.mentioned`), each required, so that the model only chooses their sentiments. The
label and the summary come before the aspects in the answer, so they are decoded the same way in both.

    .venv/bin/python bench/aspects_forced.py --json-out bench/results/aspects_forced_v10_qwen2.5-coder-0.5b_cpu.json

Prints presence precision / recall / F1 of both against the marks, and writes each review's two answers so that
the forced aspects' sentiments can be read against the text (the marks have no sentiment per aspect).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from aspect_quality import DATA, GOLD, load, score

from qwenspark.aspect_evidence import mentioned
from qwenspark.engines.base import resolve_dtype
from qwenspark.parse import ASPECT_MAP_SCHEMA, json_schema
from qwenspark.prompts import get_template
from qwenspark.schemas import ASPECTS

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct"
VERSION = "v10"  # the default prompt version: its prompt and grammar


def schema(lang: str, forced: list[str] | None) -> dict[str, Any]:
    """VERSION's schema for lang; forced: its aspects object (parse.ASPECT_MAP_SCHEMA) holds exactly these, each
    required, in ASPECTS order."""
    template = get_template(VERSION)
    out = json_schema(template.answer_order, template.summary_max_chars, lang if template.summary_script else None,
                      aspect_map=True)
    if forced is not None:
        out["properties"]["aspects"] = {
            **ASPECT_MAP_SCHEMA, "properties": {a: ASPECT_MAP_SCHEMA["properties"][a] for a in forced},
            "required": forced,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gold", type=Path, nargs="+", default=[GOLD, GOLD.with_name("aspects_heldout.jsonl")])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    # as conf/local.yaml's engine.env: the engine in this process, 2 GiB of KV cache (vLLM's CPU default asks for
    # most of the host's memory)
    for name, value in (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("VLLM_CPU_KVCACHE_SPACE", "2")):
        os.environ.setdefault(name, value)
    import pandas as pd
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    reviews = pd.concat([load(g, args.data) for g in args.gold], ignore_index=True)
    llm = LLM(model=str(args.model), max_model_len=2048, enforce_eager=True, dtype=resolve_dtype("auto", on_gpu=False),
              structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})
    template = get_template(VERSION)
    conversations, params = [], []
    for row in reviews.itertuples():
        found = mentioned(row.text)
        cues = [a for a in ASPECTS if a in found]
        for forced in (None, cues):
            conversations.append(template.messages(row.text, row.lang))
            params.append(SamplingParams(temperature=0.0, max_tokens=256, structured_outputs=StructuredOutputsParams(
                json=schema(row.lang, forced))))
    t0 = time.perf_counter()
    outputs = llm.chat(conversations, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    for i, row in enumerate(reviews.itertuples()):
        free, forced = (json.loads(outputs[2 * i + k].outputs[0].text) for k in (0, 1))
        rows.append({"source_id": row.source_id, "lang": row.lang, "text": row.text, "marked": list(row.aspects),
                     "free": free, "forced": forced})
    marked = [set(r["marked"]) for r in rows]
    report = {
        "model": str(args.model), "prompt_version": VERSION, "reviews": len(rows), "seconds": round(seconds, 1),
        "free_kept_to_cues": score(marked, [set(r["free"]["aspects"]) & mentioned(r["text"]) for r in rows]),
        "free": score(marked, [set(r["free"]["aspects"]) for r in rows]),
        "forced": score(marked, [set(r["forced"]["aspects"]) for r in rows]),
        "same_label": sum(r["free"]["sentiment"] == r["forced"]["sentiment"] for r in rows),
        "same_summary": sum(r["free"]["summary"] == r["forced"]["summary"] for r in rows),
        "rows": rows,
    }
    print(json.dumps({k: v if not isinstance(v, dict) else {m: v[m] for m in ("precision", "recall", "f1")}
                      for k, v in report.items() if k != "rows"}, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
