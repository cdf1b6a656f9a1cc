"""Executor-side throughput: the function mapInPandas runs, on pandas batches, vs the bare engine.

Runs without Spark (on the GPU machine there is none): the same `make_analyze_fn` the job ships to
executors is fed pandas frames of the demo reviews. In one run and one engine, for each condition
(guided or not, a distribution of output lengths, a batch size) it measures:
  1. bare:        one `LLM.generate` over all prompts (the engine's own best case);
  2. continuous:  the project's path (requests added and the engine stepped across batches);
  3. naive:       the project's path with `engine.continuous=false` (one synchronous generate per batch);
then, optionally, guided vs unguided cost per request at the same output lengths (the grammar's share),
memory released on close and a second engine working in the same process (GPU only), and prints the
ratios (targets: continuous/bare >= 0.95, continuous/naive >= 1.3) plus one JSON document.

Output lengths are set per request, the same for every path: dummy weights never end a JSON on their own,
so `max_tokens` is drawn per review (fixed: all --max-tokens; uniform: 16..--max-tokens; skewed: 90% 16..64
and 10% 256..512). Unguided requests (--unguided) drop the grammar and use ignore_eos with
min_tokens=max_tokens, so each output has exactly its drawn length. Every path runs on its own copy of the
prompts (a run tag in each review), so no path reuses another's prompt KV cache beyond the shared prefix.

    # GPU, Qwen-shaped dummy weights (a tokenizer folder is needed even then):
    python bench/executor_throughput.py --shape qwen3-0.6b --tokenizer TOKDIR --prompts 2048 --batch-size 256
    # the tail effect, guided and unguided, several batch sizes and length distributions in one run:
    python bench/executor_throughput.py --shape qwen3-0.6b --tokenizer TOKDIR --prompts 1536 --unguided \
        --lengths uniform,skewed --batch-sizes 256,64 --guided-cost --skip memory
    # explicit conditions MODE:LENGTHS:BATCH[:MAX_IN_FLIGHT], another structured-output backend:
    python bench/executor_throughput.py ... --conditions guided:uniform:256,unguided:skewed:64 --backend guidance
    # this CPU, the tiny test model (built by `.venv/bin/python -m tests.support.tiny_model`) or the default model:
    .venv/bin/python bench/executor_throughput.py --model .cache/test-models/tiny-qwen3 --prompts 64 --batch-size 8
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.analyze import AnalyzeSpec, make_analyze_fn, templated  # noqa: E402
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
LENGTHS = ("fixed", "uniform", "skewed")
SKEWED_SHORT, SKEWED_LONG, SKEWED_LONG_SHARE = (16, 64), (256, 512), 0.1
MODES = ("guided", "unguided")
BACKENDS = ("xgrammar", "guidance", "outlines")


def shaped_model(shape: str, tokenizer: Path, dest: Path) -> Path:
    """A config-only model folder of a published Qwen shape, with the tokenizer beside it."""
    dest.mkdir(parents=True, exist_ok=True)
    cfg = {**SHAPES[shape], "bos_token_id": 151643, "eos_token_id": 151645}
    (dest / "config.json").write_text(json.dumps(cfg))
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, dest / name)
    return dest


def review_frames(n: int, frame_rows: int, tag: str = "") -> list[pd.DataFrame]:
    """n demo reviews (repeated as needed) as CLEAN_SCHEMA frames of frame_rows rows.

    With a tag, each review starts with "(#i/tag) ": distinct prompts per run, and the index a LengthPlan reads
    (at the start, so that truncation to max_review_tokens never cuts it off)."""
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
            # distinct prompts: no cross-run caching
            "text": [f"(#{i}/{tag}) {t}" if tag else f"{t} (#{i})" for i, t in enumerate(rows["text"])],
            "input_key": "k",
            "clean_error": None,
        }
    )
    return [frame.iloc[i : i + frame_rows].reset_index(drop=True) for i in range(0, n, frame_rows)]


# --prompt-version: the template, and the guided answer's settings, of every path (set once in main).
RUN: dict[str, str] = {"prompt_version": "v1"}


def run_executor(cfg: EngineConfig, frames: list[pd.DataFrame]) -> tuple[float, pd.DataFrame]:
    spec = AnalyzeSpec(engine=cfg, prompt_version=RUN["prompt_version"], max_review_tokens=768)
    t0 = time.perf_counter()
    out = pd.concat(list(make_analyze_fn(spec)(iter(frames))), ignore_index=True)
    return time.perf_counter() - t0, out


class Condition(NamedTuple):
    mode: str  # guided | unguided
    lengths: str  # fixed | uniform | skewed
    batch_size: int
    max_in_flight: int | None = None  # None: the project's default, 2 x batch_size

    @property
    def name(self) -> str:
        tail = f":{self.max_in_flight}" if self.max_in_flight else ""
        return f"{self.mode}:{self.lengths}:{self.batch_size}{tail}"


def parse_conditions(text: str) -> list[Condition]:
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (3, 4) or parts[0] not in MODES or parts[1] not in LENGTHS:
            raise SystemExit(f"--conditions: {item!r} is not MODE:LENGTHS:BATCH[:MAX_IN_FLIGHT] ({MODES}, {LENGTHS})")
        out.append(Condition(parts[0], parts[1], int(parts[2]), int(parts[3]) if len(parts) == 4 else None))
    return out


def draw_lengths(dist: str, n: int, max_tokens: int) -> list[int]:
    """max_tokens of review i under a distribution (seeded by i: the same for every path and run)."""
    out = []
    for i in range(n):
        rng = random.Random(i)
        if dist == "fixed":
            out.append(max_tokens)
        elif dist == "uniform":
            out.append(rng.randint(16, max_tokens))
        else:
            long = rng.random() < SKEWED_LONG_SHARE
            out.append(rng.randint(*(SKEWED_LONG if long else SKEWED_SHORT)))
    return out


class LengthPlan:
    """Per-request SamplingParams, the same for the bare, continuous and naive paths.

    Wraps VllmEngine._add, where every request of the engine under test enters vLLM (attach), or is asked directly
    (params, for a plain vllm.LLM): a prompt's review index (the "(#i/tag)" review_frames writes) picks its length
    from the active table. guided: the params the engine passed for that request (its grammar, or none for an
    optimistic first attempt, and the attempt's penalty) with max_tokens = length, and an attempt without grammar
    runs exactly length tokens; unguided: no grammar, ignore_eos, exactly length tokens.
    """

    TAG = re.compile(r"\(#(\d+)/\w+\)")

    def __init__(self, engine: Any = None) -> None:
        self.misses, self.hits = 0, 0
        self.table: list[int] | None = None
        self.guided = True
        self.derived: dict[tuple[int, int], tuple[Any, Any]] = {}
        if engine is not None:
            self.attach(engine)

    def attach(self, engine: Any) -> None:
        """Plan the lengths of every request engine (a qwenspark VllmEngine) sends to vLLM."""
        add = engine._add

        def planned_add(rid: str, conversation: Any, params: Any, lang: str | None = None) -> None:
            review = conversation[-1]["content"]  # the tag leads the review, in the last message
            add(rid, conversation, self.params(review, params) if self.table is not None else params, lang)

        engine._add = planned_add

    def set(self, lengths: list[int] | None, guided: bool, langs: list[str] | None = None) -> None:
        """Activate per-request lengths (None: the engine's own params, untouched). guided: each request keeps the
        settings the engine chose for it (its language's grammar, its attempt); langs is not needed any more and
        kept for the callers."""
        self.table, self.guided, self.derived = lengths, guided, {}

    def params(self, prompt: str, default: Any) -> Any:
        found = self.TAG.findall(prompt)
        if not found or self.table is None:
            self.misses += 1
            return default
        self.hits += 1
        n = self.table[int(found[-1])]
        key = (id(default), n)
        if key not in self.derived:
            from vllm import SamplingParams

            if self.guided:
                params = copy.deepcopy(default)
                params.max_tokens = n
                if params.structured_outputs is None:  # an optimistic first attempt: the answer's real length
                    params.min_tokens, params.ignore_eos = n, True
            else:
                params = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
            self.derived[key] = (default, params)  # default kept alive: its id stays its own
        return self.derived[key][1]


def langs_of(frames: list[pd.DataFrame]) -> list[str]:
    """Each review's language, by review index (the executor detects it the same way)."""
    return [detect_lang(t, lang) for f in frames for t, lang in zip(f["text"], f["lang"], strict=True)]


def conversations_of(frames: list[pd.DataFrame]) -> list[Any]:
    template = get_template(RUN["prompt_version"])
    return [
        template.messages(t, detect_lang(t, lang)) for f in frames for t, lang in zip(f["text"], f["lang"], strict=True)
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (real weights)")
    p.add_argument("--shape", choices=sorted(SHAPES), help="build a dummy-weight model of this shape instead")
    p.add_argument("--tokenizer", type=Path, help="tokenizer folder (with --shape)")
    p.add_argument("--prompts", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batch-sizes", help="comma list of batch sizes to compare (default: --batch-size)")
    p.add_argument("--frame-rows", type=int, default=100, help="rows per incoming frame (Arrow batch)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--skip", default="", help="comma list of parts to skip: guided,memory (guided: the guided mode)")
    p.add_argument("--json-out", type=Path, help="written after every condition, so a cut-off run keeps its figures")
    p.add_argument("--vary-lengths", action="store_true", help="same as --lengths uniform")
    p.add_argument("--lengths", help=f"comma list of output-length distributions: {', '.join(LENGTHS)}")
    p.add_argument("--unguided", action="store_true",
                   help="also compare the paths without the JSON grammar (ignore_eos, exact per-request lengths)")
    p.add_argument("--conditions", help="explicit comma list MODE:LENGTHS:BATCH[:MAX_IN_FLIGHT] (overrides the above)")
    p.add_argument("--guided-cost", action="store_true",
                   help="after the first guided condition's bare run: unguided at its exact output lengths")
    p.add_argument("--backend", choices=BACKENDS, help="structured-output backend (default: the engine's)")
    p.add_argument("--prompt-version", default="v1", help="prompt template of every path (its grammar too)")
    p.add_argument("--hf-prompts", type=int, default=0, help="also run the transformers engine on this many")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if args.conditions:
        conditions = parse_conditions(args.conditions)
    else:
        modes = [m for m in (("unguided", "guided") if args.unguided else ("guided",)) if m not in skip]
        dists = (args.lengths or ("uniform" if args.vary_lengths else "fixed")).split(",")
        sizes = [int(s) for s in (args.batch_sizes or str(args.batch_size)).split(",")]
        conditions = parse_conditions(",".join(f"{m}:{d}:{b}" for m in modes for d in dists for b in sizes))

    engine_kwargs: dict[str, Any] = {}
    if args.shape:
        model = str(shaped_model(args.shape, args.tokenizer, Path("/tmp") / f"qwenspark-{args.shape}"))
        engine_kwargs["load_format"] = "dummy"
    else:
        model = args.model
    if args.backend:
        engine_kwargs["structured_outputs_config"] = {"backend": args.backend, "disable_any_whitespace": True}
    on_cpu = not _cuda()
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"} if on_cpu else {}
    RUN["prompt_version"] = args.prompt_version
    cfg = templated(EngineConfig(
        kind="vllm", model=model, batch_size=args.batch_size, max_tokens=args.max_tokens, max_model_len=2048,
        enforce_eager=args.enforce_eager or on_cpu, gpu_memory_utilization=args.gpu_memory_utilization,
        env=env, engine_kwargs=engine_kwargs,
    ), RUN["prompt_version"])
    # Resolve the config the way a task does, so the bench and the executor path share one cached engine.
    # The cache keys an engine by config and the task's GPUs: load it with the same devices the executor path pins.
    cfg, devices = pin_task_gpus(cfg)
    figures: dict[str, Any] = {"model": args.shape or model, "prompt_version": RUN["prompt_version"],
                               "prompts": args.prompts, "frame_rows": args.frame_rows,
                               "max_tokens": args.max_tokens, "device": _device_name(),
                               "tensor_parallel_size": cfg.tensor_parallel_size,
                               "skewed": {"short": SKEWED_SHORT, "long": SKEWED_LONG, "long_share": SKEWED_LONG_SHARE},
                               "conditions": []}

    def save() -> None:
        if args.json_out:
            args.json_out.write_text(json.dumps(figures, indent=2))

    free_before = _free_gpu_bytes()
    t0 = time.perf_counter()
    engine, _ = cache.get_engine(cfg, devices=devices)
    figures["engine_load_s"] = round(time.perf_counter() - t0, 1)
    figures["engine"] = _engine_settings(engine)
    print(json.dumps({k: figures[k] for k in ("engine_load_s", "engine", "tensor_parallel_size")}), flush=True)
    plan = LengthPlan(engine)
    runs = iter(range(10**6))

    def fresh_frames() -> list[pd.DataFrame]:  # a new copy of the prompts for every timed run
        return review_frames(args.prompts, args.frame_rows, f"r{next(runs)}")

    langs = langs_of(fresh_frames())
    warmed: set[str] = set()
    bare_done: dict[tuple[str, str], dict[str, Any]] = {}
    for k, cond in enumerate(conditions):
        lengths = draw_lengths(cond.lengths, args.prompts, args.max_tokens)
        plan.set(lengths, guided=cond.mode == "guided", langs=langs)
        if cond.mode not in warmed:  # CUDA graphs, grammar compile
            engine.generate(conversations_of(fresh_frames())[:16])
            warmed.add(cond.mode)
        row: dict[str, Any] = {
            "condition": cond.name, "mode": cond.mode, "lengths": cond.lengths, "batch_size": cond.batch_size,
            "max_in_flight": cond.max_in_flight or 2 * cond.batch_size, "planned_tokens": sum(lengths),
        }
        key = (cond.mode, cond.lengths)
        if key not in bare_done:
            t0 = time.perf_counter()
            bare = engine.generate(conversations_of(fresh_frames()))
            bare_s = time.perf_counter() - t0
            bare_done[key] = {"bare_s": round(bare_s, 2), "bare_tokens": sum(c.tokens_out for c in bare)}
            if args.guided_cost and cond.mode == "guided" and "guided_cost" not in figures:
                figures["guided_cost"] = guided_cost(engine, plan, fresh_frames, lengths, cond.lengths,
                                                      langs=langs)
                plan.set(lengths, guided=True, langs=langs)
        row.update(bare_done[key])
        run_cfg = cfg.model_copy(update={"batch_size": cond.batch_size, "max_in_flight": cond.max_in_flight})
        order = ("continuous", "naive") if k % 2 == 0 else ("naive", "continuous")  # alternate: no order bias
        outs: dict[str, pd.DataFrame] = {}
        for path in order:
            frames = fresh_frames()
            seconds, out = run_executor(run_cfg.model_copy(update={"continuous": path == "continuous"}), frames)
            assert len(out) == args.prompts and out["review_id"].tolist() == list(range(args.prompts)), path
            row[f"{path}_s"], outs[path] = round(seconds, 2), out
        cont, naive = outs["continuous"], outs["naive"]
        row.update({
            "order": "/".join(order),
            "continuous_tokens": int(cont["tokens_out"].sum()), "naive_tokens": int(naive["tokens_out"].sum()),
            "continuous_rows_per_s": round(args.prompts / row["continuous_s"], 1),
            "naive_rows_per_s": round(args.prompts / row["naive_s"], 1),
            "bare_rows_per_s": round(args.prompts / row["bare_s"], 1),
            "continuous_tokens_per_s": round(int(cont["tokens_out"].sum()) / row["continuous_s"]),
            "continuous_vs_naive_rows": round(row["naive_s"] / row["continuous_s"], 3),
            "continuous_vs_bare_rows": round(row["bare_s"] / row["continuous_s"], 3),
            "schema_valid_continuous": round(float(cont["error"].isna().mean()), 4),
            "output_tokens_mean": round(float(cont["tokens_out"].mean()), 1),
            "output_tokens_p10_p50_p90_max": [int(cont["tokens_out"].quantile(q)) for q in (0.1, 0.5, 0.9, 1.0)],
            "plan_misses": plan.misses,
        })
        figures["conditions"].append(row)
        print(json.dumps(row), flush=True)
        save()
    plan.set(None, guided=True)

    _print(figures)
    cache.clear()
    if not on_cpu and "memory" not in skip:
        figures.update(memory_release(cfg, free_before, conversations_of(review_frames(4, 4))))
        print(json.dumps(figures), flush=True)
    if args.hf_prompts and args.shape:
        hf_conversations = conversations_of(review_frames(args.hf_prompts, args.hf_prompts))
        figures.update(transformers_record(args.shape, Path(model), hf_conversations, cfg))
    print(json.dumps(figures))
    save()
    return 0


def _engine_settings(engine: Any) -> dict[str, Any]:
    """The vLLM settings that decide these figures (read back from the engine, not assumed)."""
    try:
        vc = engine.vllm_config if hasattr(engine, "vllm_config") else engine.llm_engine.vllm_config  # or a vllm.LLM
        return {
            "max_num_seqs": vc.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": vc.scheduler_config.max_num_batched_tokens,
            "async_scheduling": vc.scheduler_config.async_scheduling,
            "enable_prefix_caching": vc.cache_config.enable_prefix_caching,
            "structured_outputs_backend": vc.structured_outputs_config.backend,
            "disable_any_whitespace": vc.structured_outputs_config.disable_any_whitespace,
            "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
            "kv_cache_blocks": getattr(vc.cache_config, "num_gpu_blocks", None),
            "block_size": vc.cache_config.block_size,
        }
    except AttributeError as exc:
        return {"unknown": str(exc)}


def _print(figures: dict[str, Any]) -> None:
    print(f"\nexecutor throughput, {figures['model']} on {figures['device']}: {figures['prompts']} prompts, "
          f"frames of {figures['frame_rows']}, engine {figures.get('engine')}")
    print(f"  {'condition':<26} {'bare s':>7} {'cont s':>7} {'naive s':>7} {'cont/naive':>10} {'cont/bare':>9} "
          f"{'tokens c/n':>15} {'out p10/50/90/max':>18}")
    for r in figures["conditions"]:
        print(f"  {r['condition']:<26} {r['bare_s']:>7} {r['continuous_s']:>7} {r['naive_s']:>7} "
              f"{r['continuous_vs_naive_rows']:>10} {r['continuous_vs_bare_rows']:>9} "
              f"{str(r['continuous_tokens']) + '/' + str(r['naive_tokens']):>15} "
              f"{'/'.join(map(str, r['output_tokens_p10_p50_p90_max'])):>18}")
    print("  targets: continuous/bare >= 0.95, continuous/naive >= 1.3")
    if "guided_cost" in figures:
        print(f"  guided cost: {figures['guided_cost']}")
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


def guided_cost(
    engine: Any, plan: LengthPlan, fresh_frames: Any, lengths: list[int], dist: str, *, langs: list[str]
) -> dict[str, Any]:
    """A guided bare run, then an unguided one forced to its exact output lengths (fresh copies of the same
    prompts each): the difference in time is the grammar's cost."""
    plan.set(lengths, guided=True, langs=langs)
    t0 = time.perf_counter()
    guided = engine.generate(conversations_of(fresh_frames()))
    guided_s = time.perf_counter() - t0
    plan.set([max(c.tokens_out, 1) for c in guided], guided=False)
    t0 = time.perf_counter()
    unguided = engine.generate(conversations_of(fresh_frames()))
    unguided_s = time.perf_counter() - t0
    n = len(guided)
    guided_tokens, unguided_tokens = sum(c.tokens_out for c in guided), sum(c.tokens_out for c in unguided)
    return {
        "lengths": dist, "requests": n,
        "guided_s": round(guided_s, 2), "unguided_same_lengths_s": round(unguided_s, 2),
        "guided_ms_per_request": round(1000 * guided_s / n, 2),
        "unguided_ms_per_request": round(1000 * unguided_s / n, 2),
        "guided_extra_us_per_token": round(1e6 * (guided_s - unguided_s) / max(guided_tokens, 1), 1),
        "guided_overhead_share": round(1 - unguided_s / guided_s, 3),
        "guided_tokens": guided_tokens, "unguided_tokens": unguided_tokens,
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
