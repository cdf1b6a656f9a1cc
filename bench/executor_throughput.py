"""Executor-side throughput: the function mapInPandas runs, on pandas batches, vs the bare engine.

Runs without Spark (on the GPU machine there is none): the same `make_analyze_fn` the job ships to
executors is fed pandas frames of the demo reviews. In one run and one engine it measures:
  1. bare:        one `LLM.generate` over all prompts (the engine's own best case);
  2. continuous:  the project's path (requests added and the engine stepped across batches);
  3. naive:       the project's path with `engine.continuous=false` (one synchronous generate per batch);
  4. guided vs unguided cost per request at the same output lengths (xgrammar's share);
  5. memory released on close and a second engine working in the same process (GPU only);
and prints the ratios (targets: continuous/bare >= 0.95, continuous/naive >= 1.3) plus one JSON line.

    # GPU, Qwen-shaped dummy weights (a tokenizer folder is needed even then):
    python bench/executor_throughput.py --shape qwen3-0.6b --tokenizer TOKDIR --prompts 2048 --batch-size 256
    # this CPU, the tiny test model or the default model:
    .venv/bin/python bench/executor_throughput.py --model .cache/test-models/tiny-qwen3 --prompts 64 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.analyze import AnalyzeSpec, make_analyze_fn  # noqa: E402
from qwenspark.config import EngineConfig  # noqa: E402
from qwenspark.engines import cache  # noqa: E402
from qwenspark.prompts import detect_lang, get_template  # noqa: E402
from qwenspark.resources import pin_task_gpus  # noqa: E402

# Published shapes of Qwen3-0.6B and Qwen2.5-7B-Instruct (config.json fields that set the cost).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "hidden_act": "silu",
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
        "max_position_embeddings": 32768, "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "hidden_act": "silu", "use_sliding_window": False,
    },
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def shaped_model(shape: str, tokenizer: Path, dest: Path) -> Path:
    """A config-only model folder of a published Qwen shape, with the tokenizer beside it."""
    dest.mkdir(parents=True, exist_ok=True)
    cfg = {**SHAPES[shape], "bos_token_id": 151643, "eos_token_id": 151645}
    (dest / "config.json").write_text(json.dumps(cfg))
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, dest / name)
    return dest


def review_frames(n: int, frame_rows: int) -> list[pd.DataFrame]:
    """n demo reviews (repeated as needed) as CLEAN_SCHEMA frames of frame_rows rows."""
    demo = pd.read_csv(ROOT / "data" / "demo" / "hotel_reviews_demo.csv", dtype=str, keep_default_na=False)
    demo = demo[demo["text"].str.strip() != ""]
    demo = demo[demo["text"].str.len() < 1500]  # keep prompt lengths comparable across runs
    rows = pd.concat([demo] * (n // len(demo) + 1), ignore_index=True).head(n)
    frame = pd.DataFrame(
        {
            "review_id": range(n),
            "hotel_id": rows["hotel_id"].to_numpy(),
            "created_at": pd.Timestamp("2026-11-01"),
            "lang": rows["lang"].to_numpy(),
            "text": [f"{t} (#{i})" for i, t in enumerate(rows["text"])],  # distinct prompts: no cross-run caching
            "input_key": "k",
            "clean_error": None,
        }
    )
    return [frame.iloc[i : i + frame_rows].reset_index(drop=True) for i in range(0, n, frame_rows)]


def run_executor(cfg: EngineConfig, frames: list[pd.DataFrame]) -> tuple[float, pd.DataFrame]:
    spec = AnalyzeSpec(engine=cfg, prompt_version="v1", max_review_tokens=768)
    t0 = time.perf_counter()
    out = pd.concat(list(make_analyze_fn(spec)(iter(frames))), ignore_index=True)
    return time.perf_counter() - t0, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (real weights)")
    p.add_argument("--shape", choices=sorted(SHAPES), help="build a dummy-weight model of this shape instead")
    p.add_argument("--tokenizer", type=Path, help="tokenizer folder (with --shape)")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--frame-rows", type=int, default=100, help="rows per incoming frame (Arrow batch)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--skip", default="", help="comma list of parts to skip: guided,memory")
    p.add_argument("--json-out", type=Path)
    p.add_argument("--vary-lengths", action="store_true", help="per-request max_tokens, uniform 16..max_tokens")
    p.add_argument("--hf-prompts", type=int, default=0, help="also run the transformers engine on this many")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    engine_kwargs: dict[str, Any] = {}
    if args.shape:
        model = str(shaped_model(args.shape, args.tokenizer, Path("/tmp") / f"qwenspark-{args.shape}"))
        engine_kwargs["load_format"] = "dummy"
    else:
        model = args.model
    on_cpu = not _cuda()
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"} if on_cpu else {}
    cfg = EngineConfig(
        kind="vllm", model=model, batch_size=args.batch_size, max_tokens=args.max_tokens, max_model_len=2048,
        enforce_eager=args.enforce_eager or on_cpu, gpu_memory_utilization=args.gpu_memory_utilization,
        env=env, engine_kwargs=engine_kwargs,
    )
    # Resolve the config the way a task does, so the bench and the executor path share one cached engine.
    cfg, _ = pin_task_gpus(cfg)
    frames = review_frames(args.prompts, args.frame_rows)
    template = get_template("v1")
    conversations = [
        template.messages(t, detect_lang(t, lang)) for f in frames for t, lang in zip(f["text"], f["lang"], strict=True)
    ]
    figures: dict[str, Any] = {"model": args.shape or model, "prompts": args.prompts, "batch_size": args.batch_size,
                               "max_tokens": args.max_tokens, "device": _device_name()}

    free_before = _free_gpu_bytes()
    t0 = time.perf_counter()
    engine, _ = cache.get_engine(cfg)
    figures["engine_load_s"] = round(time.perf_counter() - t0, 1)
    if args.vary_lengths:
        vary_lengths(engine, conversations, args.max_tokens)
    engine.generate(conversations[: min(8, len(conversations))])  # warm-up (CUDA graphs, grammar cache)

    t0 = time.perf_counter()
    bare = engine.generate(conversations)
    bare_s = time.perf_counter() - t0
    bare_tokens = sum(c.tokens_out for c in bare)

    cont_s, cont = run_executor(cfg, frames)
    naive_s, naive = run_executor(cfg.model_copy(update={"continuous": False}), frames)
    for name, out in (("continuous", cont), ("naive", naive)):
        assert len(out) == args.prompts and out["review_id"].tolist() == list(range(args.prompts)), name
    cont_tokens, naive_tokens = int(cont["tokens_out"].sum()), int(naive["tokens_out"].sum())
    figures.update({
        "bare_s": round(bare_s, 2), "bare_rows_per_s": round(args.prompts / bare_s, 1),
        "bare_tokens_per_s": round(bare_tokens / bare_s), "continuous_s": round(cont_s, 2),
        "continuous_rows_per_s": round(args.prompts / cont_s, 1),
        "continuous_tokens_per_s": round(cont_tokens / cont_s),
        "naive_s": round(naive_s, 2), "naive_rows_per_s": round(args.prompts / naive_s, 1),
        "naive_tokens_per_s": round(naive_tokens / naive_s),
        "continuous_vs_bare_rows": round(bare_s / cont_s, 3),
        "continuous_vs_naive_rows": round(naive_s / cont_s, 3),
        "schema_valid_continuous": round(float(cont["error"].isna().mean()), 4),
        "output_tokens_mean": round(cont_tokens / args.prompts, 1),
        "output_tokens_p10_p90": [int(cont["tokens_out"].quantile(0.1)), int(cont["tokens_out"].quantile(0.9))],
    })

    _print(figures, args)
    if "guided" not in skip:
        figures.update(guided_cost(engine, conversations, bare))
        print(json.dumps(figures), flush=True)
    cache.clear()
    if not on_cpu and "memory" not in skip:
        figures.update(memory_release(cfg, free_before, conversations[:4]))
        print(json.dumps(figures), flush=True)
    if args.hf_prompts and args.shape:
        figures.update(transformers_record(args.shape, Path(model), conversations[: args.hf_prompts], cfg))
    print(json.dumps(figures))
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=2))
    return 0


def _print(figures: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\nexecutor throughput, {figures['model']} on {figures['device']}: {args.prompts} prompts, "
          f"batch {args.batch_size}, max_tokens {args.max_tokens}, output tokens p10-p90 "
          f"{figures['output_tokens_p10_p90']}")
    for key in ("bare", "continuous", "naive"):
        print(f"  {key:<11} {figures[key + '_s']:>8} s  {figures[key + '_rows_per_s']:>8} rows/s  "
              f"{figures[key + '_tokens_per_s']:>8} tokens/s")
    print(f"  continuous vs bare (rows/s ratio):  {figures['continuous_vs_bare_rows']}  (target >= 0.95)")
    print(f"  continuous vs naive (rows/s ratio): {figures['continuous_vs_naive_rows']}  (target >= 1.3)")
    print(json.dumps(figures), flush=True)


def transformers_record(shape: str, model: Path, conversations: list[Any], cfg: EngineConfig) -> dict[str, Any]:
    """For the record: the transformers engine on the same shape (random weights saved once), one batch."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from qwenspark.engines.transformers import TransformersEngine

    hf_dir = Path("/tmp") / f"qwenspark-{shape}-hf"
    if not (hf_dir / "config.json").exists():
        net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=torch.bfloat16)
        net.save_pretrained(hf_dir)
        for name in TOKENIZER_FILES:
            if (model / name).exists():
                shutil.copy(model / name, hf_dir / name)
    engine = TransformersEngine(cfg.model_copy(update={"kind": "transformers", "model": str(hf_dir),
                                                        "engine_kwargs": {"device_map": "cuda"}}))
    engine.generate(conversations[:2])
    t0 = time.perf_counter()
    out = engine.generate(conversations)
    seconds = time.perf_counter() - t0
    tokens = sum(c.tokens_out for c in out)
    engine.close()
    return {"hf_prompts": len(conversations), "hf_s": round(seconds, 2), "hf_tokens_per_s": round(tokens / seconds),
            "hf_rows_per_s": round(len(conversations) / seconds, 1)}


def vary_lengths(engine: Any, conversations: list[Any], max_tokens: int) -> None:
    """Give each request its own max_tokens (uniform 16..max): dummy weights never end a JSON on their own,
    so this is how outputs of different lengths are made. Applies to every path alike."""
    import copy
    import random

    table = {}
    for i, conv in enumerate(conversations):
        params = copy.deepcopy(engine._params)
        params.max_tokens = random.Random(i).randint(16, max_tokens)
        table[engine.render(conv)] = params
    llm = engine._llm
    generate, add_request = llm.generate, llm.llm_engine.add_request
    llm.generate = lambda prompts, params, **kw: generate(prompts, [table.get(p, params) for p in prompts], **kw)
    llm.llm_engine.add_request = lambda rid, prompt, params, *a, **kw: add_request(
        rid, prompt, table.get(prompt, params) if isinstance(prompt, str) else params, *a, **kw
    )


def guided_cost(engine: Any, conversations: list[Any], guided: list[Any]) -> dict[str, Any]:
    """Unguided generation forced to the guided run's output lengths: the difference is the grammar's cost."""
    from vllm import SamplingParams

    prompts = [engine.render(c) for c in conversations]
    params = [
        SamplingParams(temperature=0, max_tokens=max(c.tokens_out, 1), min_tokens=max(c.tokens_out, 1), ignore_eos=True)
        for c in guided
    ]
    llm = engine._llm
    t0 = time.perf_counter()
    guided_again = llm.generate(prompts, engine._params, use_tqdm=False)
    guided_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    unguided = llm.generate(prompts, params, use_tqdm=False)
    unguided_s = time.perf_counter() - t0
    n = len(prompts)
    return {
        "guided_s": round(guided_s, 2), "unguided_same_lengths_s": round(unguided_s, 2),
        "guided_ms_per_request": round(1000 * guided_s / n, 2),
        "unguided_ms_per_request": round(1000 * unguided_s / n, 2),
        "guided_overhead_share": round(1 - unguided_s / guided_s, 3),
        "guided_tokens": sum(len(o.outputs[0].token_ids) for o in guided_again),
        "unguided_tokens": sum(len(o.outputs[0].token_ids) for o in unguided),
    }


def memory_release(cfg: EngineConfig, free_before: int, sample: list[Any]) -> dict[str, Any]:
    """After cache.clear() the GPU memory is back; a second engine in the same process works."""
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    free_after = _free_gpu_bytes()
    second, _ = cache.get_engine(cfg.model_copy(update={"seed": 1}))
    ok = len(second.generate(sample)) == len(sample)
    cache.clear()
    return {
        "gpu_free_before_gib": round(free_before / 2**30, 2), "gpu_free_after_close_gib": round(free_after / 2**30, 2),
        "gpu_released_share": round(free_after / free_before, 4), "second_engine_ok": ok,
    }


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def _free_gpu_bytes() -> int:
    if not _cuda():
        return 0
    import torch

    return int(torch.cuda.mem_get_info()[0])


def _device_name() -> str:
    if _cuda():
        import torch

        return str(torch.cuda.get_device_name(0))
    return f"CPU ({os.cpu_count()} cores)"


if __name__ == "__main__":
    sys.exit(main())
