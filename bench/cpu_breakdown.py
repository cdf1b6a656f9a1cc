"""Where a CPU's time goes in the demo's answers: prefill (the prompt) against decode (the answer), through vLLM.

The demo's prompt version (v10, guided JSON) on the default model, the demo's first non-blank reviews, one vLLM engine
in this process as conf/local.yaml sets it (float32 or bf16 as the CPU has it, 2 GiB of KV cache, prefix caching on;
the label's log-probabilities, which the job also asks for, are left out). In one run, on the same prompts:
  1. prefill: every prompt with max_tokens=1 (after one prompt has put the shared system prompt and few-shot turns
     in the prefix cache, as the job's first batch does);
  2. whole:   the same prompts answered in full with the guided grammar, on a fresh copy of each prompt (a tag in the
     review, so no prompt's own KV is reused beyond the shared prefix);
and prints tokens per review (shared prefix, the review's own, the answer) and the seconds of each, so that
whole - prefill is the decode's share. A measurement for the README's note on slow CPUs, not a test.

    .venv/bin/python bench/cpu_breakdown.py --reviews 16 --json-out bench/results/cpu_breakdown_<host>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache/models/qwen2.5-coder-0.5b-instruct"
DEMO = ROOT / "data/demo/hotel_reviews_demo.csv"
VERSION = "v10"


def cpu_flags(info: str) -> dict[str, Any]:
    """The CPU's model name, cores and the vector extensions that decide the model's speed (from /proc/cpuinfo)."""
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
    return {"cpu": name or platform.processor(), "cores": os.cpu_count(),
            "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--reviews", type=int, default=16)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    from qwenspark.config import load_config

    engine = load_config(ROOT / "conf/local.yaml").engine  # the demo's engine settings, read rather than copied
    for name, value in engine.env.items():
        os.environ.setdefault(name, value)  # before vllm is imported, as the executor does
    import pandas as pd
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from qwenspark.analyze import templated
    from qwenspark.engines.base import resolve_dtype
    from qwenspark.parse import answer_grammars
    from qwenspark.prompts import detect_lang, get_template

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    dtype = resolve_dtype(engine.dtype, on_gpu=False, cpuinfo=cpuinfo)  # the flags reported below decide it
    demo = pd.read_csv(DEMO, keep_default_na=False)  # blank reviews (the demo has four) are not the model's work
    reviews = demo[demo["text"].str.strip() != ""].head(args.reviews)
    langs = [detect_lang(text, lang or None) for text, lang in zip(reviews["text"], reviews["lang"], strict=True)]
    template = get_template(VERSION)
    llm = LLM(model=str(args.model), max_model_len=engine.max_model_len, enforce_eager=engine.enforce_eager,
              dtype=dtype, enable_prefix_caching=True,
              structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})
    tokenizer = llm.get_tokenizer()
    cfg_grammars = answer_grammars(templated(engine, VERSION))

    def prompts(tag: str) -> list[list[dict[str, str]]]:
        return [template.messages(f"{text} ({tag})", lang) for text, lang in zip(reviews["text"], langs, strict=True)]

    def ids(conversation: list[dict[str, str]]) -> list[int]:
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))

    warm = prompts("warm")[:1]
    llm.chat(warm, SamplingParams(max_tokens=1), use_tqdm=False)  # the shared prefix into the cache
    first = prompts("prefill")
    shared = _common_prefix([ids(c) for c in first])
    t0 = time.perf_counter()
    prefilled = llm.chat(first, SamplingParams(max_tokens=1), use_tqdm=False)
    prefill_s = time.perf_counter() - t0

    whole = prompts("whole")
    params = [SamplingParams(temperature=0.0, max_tokens=256, structured_outputs=StructuredOutputsParams(
        **cfg_grammars.get(lang, cfg_grammars[None]))) for lang in langs]
    t0 = time.perf_counter()
    outputs = llm.chat(whole, params, use_tqdm=False)
    whole_s = time.perf_counter() - t0

    prompt_tokens = [len(o.prompt_token_ids or []) for o in outputs]
    answer_tokens = [len(o.outputs[0].token_ids) for o in outputs]
    n = len(outputs)
    report = {
        "host": cpu_flags(cpuinfo), "dtype": dtype, "model": args.model.name, "prompt_version": VERSION, "reviews": n,
        "tokens_per_review": {"shared_prefix": len(shared),
                              "review_own": round(sum(prompt_tokens) / n - len(shared), 1),
                              "answer": round(sum(answer_tokens) / n, 1),
                              "prefix_cache_hits": round(sum(o.num_cached_tokens or 0 for o in prefilled) / n, 1)},
        "prefill_s": round(prefill_s, 2), "whole_s": round(whole_s, 2), "decode_s": round(whole_s - prefill_s, 2),
        "prefill_share": round(prefill_s / whole_s, 3), "reviews_per_s": round(n / whole_s, 3),
        "answer_tokens_per_s": round(sum(answer_tokens) / max(whole_s - prefill_s, 1e-9), 2),
    }
    print(json.dumps(report, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    k = next((i for i in range(n) if any(s[i] != first[i] for s in seqs)), n)
    return first[:k]


if __name__ == "__main__":
    main()
