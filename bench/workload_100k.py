"""The 100k-review workload on one GPU (issue 13): the executor function vs bare vLLM, answers as long as real ones.

    python bench/workload_100k.py --shape qwen2.5-7b --tokenizer TOK --data reviews_dev.csv --reviews 20000 \
        --strategies v1,v9 --lengths-from v1=EVAL_V1.json,v9=EVAL_V9.json [--quantization fp8] [--bare-reviews 2048] \
        [--max-in-flight 512] [--json-out F]

Reviews are sampled (seeded, with replacement) from the labelled dev reviews, --en-share of them English (0.4
gives the ~320 characters per review of the workload the issue quotes: zh reviews average 129, en 603). For each
strategy (a prompt version: its prompt, guided grammar and answer form) one engine is loaded, then in one run:
  bare:     one vllm.LLM.generate over --bare-reviews prompts with the same per-request settings (vLLM's best
            case), on a plain vllm.LLM loaded first with the engine's settings and shut down before the engine loads
            (--bare engine: the engine's own generate() instead, no second load);
  executor: make_analyze_fn, the function mapInPandas runs, over --reviews reviews in frames of --frame-rows, on the
            job's engine (VllmEngine: AsyncLLM streams when the engine core has its own process, as on GPUs);
each on its own copy of the prompts (a tag at the start of each review), so no path reuses another's review KV.
Dummy weights never end an answer as a trained model does: each request's max_tokens is drawn (seeded by review)
from the tokens-per-review percentiles of a real CPU eval of that prompt version (`qwenspark eval --out`:
tokens_out_percentiles), so decode work has the real answers' lengths. The answers themselves are random text
cut at that length, so schema validity is the CPU eval's (real model), not this run's.

Prints reviews/s, output tok/s, the fraction of the HBM and compute bounds (the arithmetic is in the JSON) and the
projected minutes per 100k reviews. Ceilings are the ones measured on this workplace's H200s (KINDS.md): a
device-to-device copy at 4.3 TB/s and a bf16 matrix product at 790 TFLOP/s.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.executor_throughput import (  # noqa: E402
    RUN,
    SHAPES,
    LengthPlan,
    _cuda,
    _device_name,
    _engine_settings,
    shaped_model,
)
from qwenspark.analyze import AnalyzeSpec, make_analyze_fn, templated  # noqa: E402
from qwenspark.config import EngineConfig  # noqa: E402
from qwenspark.engines import cache  # noqa: E402
from qwenspark.prompts import detect_lang, get_template  # noqa: E402
from qwenspark.resources import pin_task_gpus  # noqa: E402
from qwenspark.serve.sizing import layer_parameters  # noqa: E402

HBM_BYTES_PER_S = 4.3e12  # measured copy bandwidth, bytes read + written (KINDS.md, nvidia-h200)
BF16_FLOPS = 790e12  # measured dense bf16 matrix rate on random data (KINDS.md)
TARGET_REVIEWS, TARGET_MINUTES = 100_000, 10.0


def sample_reviews(data: Path, n: int, en_share: float, seed: int = 0) -> pd.DataFrame:
    """n reviews drawn with replacement, en_share of them English (empty texts left out)."""
    rows = pd.read_csv(data, dtype=str, keep_default_na=False)
    rows = rows[rows["text"].str.strip() != ""]
    n_en = round(n * en_share)
    parts = [rows[rows["lang"] == "en"].sample(n_en, replace=True, random_state=seed),
             rows[rows["lang"] == "zh"].sample(n - n_en, replace=True, random_state=seed + 1)]
    return pd.concat(parts).sample(frac=1.0, random_state=seed + 2).reset_index(drop=True)


def frames_of(reviews: pd.DataFrame, n: int, frame_rows: int, tag: str) -> list[pd.DataFrame]:
    """The first n reviews as executor input frames (EXECUTOR_IN_SCHEMA); each text starts with "(#i/tag) ", which
    LengthPlan reads and which keeps this copy's prompts apart from every other copy's."""
    head = reviews.head(n)
    frame = pd.DataFrame({
        "review_id": range(n),
        "hotel_id": "H1",
        "created_at": 1_764_547_200_000_000,  # microseconds, as the executor gets timestamps
        "lang": head["lang"].to_numpy(),
        "text": [f"(#{i}/{tag}) {t}" for i, t in enumerate(head["text"])],
        "input_key": "k",
        "clean_error": None,
    })
    return [frame.iloc[i : i + frame_rows].reset_index(drop=True) for i in range(0, n, frame_rows)]


def draw_lengths(percentiles: list[int], n: int, cap: int) -> list[int]:
    """n output lengths from a 0, 5, ..., 100th percentile table (linear between points), seeded by index."""
    qs = [q / (len(percentiles) - 1) for q in range(len(percentiles))]
    out = []
    for i in range(n):
        u = random.Random(i).random()
        k = min(bisect.bisect_right(qs, u), len(qs) - 1)
        lo, hi = percentiles[k - 1], percentiles[k]
        frac = (u - qs[k - 1]) / (qs[k] - qs[k - 1])
        out.append(max(1, min(cap, round(lo + frac * (hi - lo)))))
    return out


def shape_costs(shape: dict[str, Any], quantized: bool) -> dict[str, float]:
    """Parameters, weight bytes read per decode step and KV bytes per token of a published shape."""
    h, layers, vocab = shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    hd = shape.get("head_dim", h // heads)
    linear = layer_parameters(shape)
    head = vocab * h  # the LM head runs on every token (tied or not); the embedding lookup reads one row
    weight_bytes = linear * (1 if quantized else 2) + head * 2  # fp8 quantizes the layers, not the LM head
    # fp8 matrix products run at twice the bf16 rate on Hopper (datasheet; not measured here): the layers' share.
    return {"linear_params": linear, "lm_head_params": head, "weight_bytes_per_step": weight_bytes,
            "linear_rate": 2.0 if quantized else 1.0,
            "kv_bytes_per_token": 2 * layers * kv * hd * 2, "attn_flops_per_token_per_ctx": 4 * layers * heads * hd}


def bounds(costs: dict[str, float], *, concurrency: int, prompt_tokens: float, cached_tokens: float,
           out_tokens: float) -> dict[str, Any]:
    """HBM and compute bounds on output tok/s and reviews/s for this workload, with the arithmetic."""
    context = prompt_tokens + out_tokens / 2  # mean context a decode step attends over
    step_bytes = costs["weight_bytes_per_step"] + concurrency * context * costs["kv_bytes_per_token"]
    hbm_tok_s = concurrency * HBM_BYTES_PER_S / step_bytes
    flops_per_token = 2 * (costs["linear_params"] + costs["lm_head_params"])
    new_prompt = prompt_tokens - cached_tokens  # the shared prefix is prefix-cached, computed once
    tokens = new_prompt + out_tokens
    attention = costs["attn_flops_per_token_per_ctx"] * (new_prompt * (cached_tokens + new_prompt / 2)
                                                         + out_tokens * context)
    review_flops = flops_per_token * tokens + attention
    # Seconds of matrix work per review, the layers at their rate and the LM head and attention at bf16's.
    review_s = (2 * costs["linear_params"] * tokens / costs["linear_rate"]
                + 2 * costs["lm_head_params"] * tokens + attention) / BF16_FLOPS
    compute_reviews_s = 1 / review_s
    return {
        "hbm": (f"step = {costs['weight_bytes_per_step'] / 1e9:.2f} GB weights + {concurrency} seqs x "
                f"{context:.0f} ctx x {costs['kv_bytes_per_token'] / 1e3:.1f} kB KV = {step_bytes / 1e9:.2f} GB; "
                f"{concurrency} tokens per step at {HBM_BYTES_PER_S / 1e12:.1f} TB/s"),
        "hbm_tok_s": round(hbm_tok_s), "hbm_reviews_s": round(hbm_tok_s / out_tokens, 1),
        "compute": (f"review = {flops_per_token / 1e9:.1f} GFLOP/token x ({new_prompt:.0f} new prompt + "
                    f"{out_tokens:.0f} out) + attention = {review_flops / 1e12:.2f} TFLOP at "
                    f"{BF16_FLOPS / 1e12:.0f} TFLOP/s bf16"
                    + (" (layers at 2x in fp8)" if costs["linear_rate"] > 1 else "")),
        "compute_reviews_s": round(compute_reviews_s, 1), "compute_tok_s": round(compute_reviews_s * out_tokens),
    }


class ValidShare:
    """Dummy weights write no JSON without the grammar; a trained model's unguided answers fit it at the rate a real
    CPU eval of the strategy measured (1 - its repaired_rate). That share of first attempts (by review index,
    seeded) gets a canned valid answer in its review's language in place of its text, with the tokens it generated;
    the others are retried with the grammar by the executor, as in production. Wraps the engine's submit/step."""

    ANSWER: ClassVar[dict[str, dict[str, str]]] = {  # by answer format (engine.answer_format), then language
        "json": {"zh": '{"sentiment":"positive","summary":"房间干净，服务很好","aspects":{"room":"positive"}}',
                 "en": '{"sentiment":"positive","summary":"Clean room, kind staff","aspects":{"room":"positive"}}'},
        "lines": {"zh": 'positive\n"房间干净，服务很好"\nroom:positive',
                  "en": 'positive\n"Clean room, kind staff"\nroom:positive'},
    }

    def __init__(self, engine: Any, share: float, answer_format: str) -> None:
        self.share, self.first, self.retried = share, {}, 0
        answers = self.ANSWER[answer_format]
        submit, step = engine.submit, engine.step

        def valid_submit(conversation: Any, lang: str | None = None, **kw: Any) -> str:
            rid = submit(conversation, lang, **kw)
            if kw.get("retry") is None:
                found = LengthPlan.TAG.findall(conversation[-1]["content"])
                if found and random.Random(f"valid{found[-1]}").random() < self.share:
                    self.first[rid] = lang or "en"
            else:
                self.retried += 1
            return rid

        def valid_step() -> list[tuple[str, Any]]:
            out = []
            for rid, done in step():
                lang = self.first.pop(rid, None)
                text = answers.get(lang or "en", answers["en"])
                out.append((rid, done if lang is None else dataclasses.replace(done, text=text, finish_reason="stop")))
            return out

        engine.submit, engine.step = valid_submit, valid_step


def strategy(name: str) -> tuple[str, float | None]:
    """A strategy: VERSION[-guided][-noscript][@SHARE]. -guided: an optimistic version decoded with the grammar from
    the first token; -noscript: without the summary-script pattern (maxLength only); @SHARE: this strategy's
    --unguided-valid. Modified versions are registered here as bench-only prompt versions (to measure each lever)."""
    from qwenspark import prompts

    version, _, share = name.partition("@")
    base = version.removesuffix("-noscript")  # VERSION-guided is a version of its own (prompts.get_template)
    if version != base:
        prompts.TEMPLATES[version] = dataclasses.replace(get_template(base), version=version, summary_script=False)
    return version, float(share) if share else None


def shared_prefix_tokens(engine: Any, version: str) -> int:
    """Tokens every prompt of this version shares (system and few-shot turns): what prefix caching computes once."""
    template = get_template(version)
    a, b = (engine._tokenizer.encode(engine.render(template.messages(t, "en"))) for t in ("aaa", "bbb"))
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def bare_llm_generate(cfg: EngineConfig, plan: LengthPlan, warm: list[Any], conversations: list[Any],
                      langs: list[str]) -> tuple[float, int, dict[str, Any]]:
    """vLLM's own best case: a plain vllm.LLM with the engine's settings, one LLM.generate over the conversations with
    the engine's per-request settings and the planned lengths; shut down after. (seconds, output tokens, settings)"""
    from vllm import LLM

    from qwenspark.engines.vllm import (
        _release_process_memory,
        apply_env,
        engine_kwargs,
        gpu_env,
        on_gpu,
        sampling_params,
    )

    apply_env(cfg)
    if on_gpu():
        gpu_env(os.environ, chosen=cfg.env)  # as VllmEngine does: the same engine-core threads on both sides
    llm = LLM(cfg.model, **engine_kwargs(cfg))
    tokenizer = llm.get_tokenizer()
    per_lang = sampling_params(cfg, final_only=True)  # the engine's own settings: answers read once finished

    def run(llm: Any, convs: list[Any]) -> tuple[float, int]:
        prompts = [tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in convs]
        params = [plan.params(pr, per_lang.get((lang, None), per_lang[None, None]))
                  for pr, lang in zip(prompts, langs, strict=False)]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

    run(llm, warm)
    seconds, tokens = run(llm, conversations)
    settings = _engine_settings(llm)
    llm.llm_engine.engine_core.shutdown()
    del llm
    _release_process_memory()  # as VllmEngine.close does: the engine loads next, on the same GPU
    return seconds, tokens, settings


def run_strategy(args: argparse.Namespace, version: str, reviews: pd.DataFrame, *, lengths_table: list[int],
                 model: str, engine_kwargs: dict[str, Any], valid_share: float) -> dict[str, Any]:
    """One engine for the prompt version; bare then executor; the figures."""
    RUN["prompt_version"] = version
    on_cpu = not _cuda()  # a smoke run here, with the tiny test model
    # repair_penalty 0: a dummy model's guided answers run to their forced length, which a trained model's answers
    # do 0.2-0.5 % of the time (CPU evals); repairing each would double the decode work of a toy, not of users.
    # cut_dead_ends off: dummy weights' unguided text would be cut at its first token, and the played first attempts
    # (ValidShare) are meant whole, at their planned lengths (as bench/device/serve-h200.yaml for the service).
    cfg = templated(EngineConfig(
        kind="vllm", model=model, batch_size=args.batch_size, max_in_flight=args.max_in_flight,
        max_tokens=args.max_tokens, max_model_len=4096, gpu_memory_utilization=None if on_cpu else args.gpu_memory,
        enforce_eager=on_cpu, engine_kwargs=engine_kwargs, repair_penalty=0.0, yield_to_service=args.yield_to_service,
        cut_dead_ends=False,
        env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"} if on_cpu else dict(args.env),
    ), version)
    cfg, devices = pin_task_gpus(cfg)
    plan = LengthPlan()
    lengths = draw_lengths(lengths_table, len(reviews), args.max_tokens)  # by review index, every copy alike
    langs = [detect_lang(t, lang) for t, lang in zip(reviews["text"], reviews["lang"], strict=True)]
    plan.set(lengths, guided=True, langs=langs)
    template = get_template(version)

    def conversations(frames: list[pd.DataFrame]) -> list[Any]:
        return [template.messages(t, detect_lang(t, lang)) for f in frames
                for t, lang in zip(f["text"], f["lang"], strict=True)]

    warm_conv = conversations(frames_of(reviews, 64, 64, "warm"))  # graphs, grammar compile
    bare_conv = conversations(frames_of(reviews, args.bare_reviews, args.bare_reviews, "bare"))
    bare_llm = None
    if args.bare == "llm":
        bare_s, bare_tokens, bare_llm = bare_llm_generate(cfg, plan, warm_conv, bare_conv, langs)
    t0 = time.perf_counter()
    engine, _ = cache.get_engine(cfg, devices=devices)
    load_s = time.perf_counter() - t0
    plan.attach(engine)
    valid = ValidShare(engine, valid_share, cfg.answer_format) if cfg.optimistic else None
    engine.generate(warm_conv, langs[:64])
    if args.bare == "engine":
        t0 = time.perf_counter()
        bare = engine.generate(bare_conv, langs[: args.bare_reviews])
        bare_s, bare_tokens = time.perf_counter() - t0, sum(c.tokens_out for c in bare)
    spec = AnalyzeSpec(engine=cfg, prompt_version=version, max_review_tokens=768)
    print(f"exec phase: {version}, {args.reviews} reviews", flush=True)  # bench/serve_latency.py --alongside waits
    t0 = time.perf_counter()
    out = pd.concat(list(make_analyze_fn(spec)(iter(frames_of(reviews, args.reviews, args.frame_rows, "exec")))),
                    ignore_index=True)
    exec_s = time.perf_counter() - t0
    if len(out) != args.reviews or out["review_id"].tolist() != list(range(args.reviews)):
        raise AssertionError(f"{version}: {args.reviews} reviews in, {len(out)} rows out")
    tokens_out, tokens_in = int(out["tokens_out"].sum()), float(out["tokens_in"].mean())
    cached = shared_prefix_tokens(engine, version)
    exec_rps, bare_rps = args.reviews / exec_s, args.bare_reviews / bare_s
    mean_out = tokens_out / args.reviews
    costs = shape_costs(SHAPES[args.shape], bool(args.quantization)) if args.shape else None
    row: dict[str, Any] = {
        "strategy": version + (f"@{valid_share}" if cfg.optimistic else ""),
        "quantization": args.quantization or "bf16", "reviews": args.reviews,
        "bare_reviews": args.bare_reviews, "bare": args.bare, "bare_llm_engine": bare_llm,
        "engine_load_s": round(load_s, 1), "engine": _engine_settings(engine),
        "exec_s": round(exec_s, 1), "bare_s": round(bare_s, 1),
        "exec_reviews_per_s": round(exec_rps, 1), "bare_reviews_per_s": round(bare_rps, 1),
        "exec_vs_bare": round(exec_rps / bare_rps, 3),
        "exec_out_tok_per_s": round(tokens_out / exec_s),
        "bare_out_tok_per_s": round(bare_tokens / bare_s),
        "mean_tokens_out": round(mean_out, 1),
        "planned_tokens_out": round(sum(lengths[: args.reviews]) / args.reviews, 1),
        "mean_tokens_in": round(tokens_in, 1), "shared_prefix_tokens": cached,
        "rows_with_error": int(out["error"].notna().sum()),
        "optimistic": cfg.optimistic, "unguided_valid_share": valid_share if cfg.optimistic else None,
        "retried_with_grammar": valid.retried if valid is not None else 0,
        "projected_min_per_100k": round(TARGET_REVIEWS / exec_rps / 60, 1), "detokenize": args.detokenize,
        "yield_to_service": args.yield_to_service,
        "held_for_service_s": round(engine._yielding.held_s, 1) if getattr(engine, "_yielding", None) else 0.0,
    }
    if costs is not None:
        b = bounds(costs, concurrency=args.max_in_flight, prompt_tokens=tokens_in, cached_tokens=cached,
                   out_tokens=mean_out)
        row.update(bounds=b, share_of_hbm_bound=round(row["exec_out_tok_per_s"] / b["hbm_tok_s"], 3),
                   share_of_compute_bound=round(exec_rps / b["compute_reviews_s"], 3))
    cache.clear()
    return row


def detokenize_each_token() -> None:
    """The engine's and the bare run's vLLM settings with vLLM detokenising each token (engines.vllm.sampling_params
    leaves a batch answer's decoding to the engine, once it is finished)."""
    from qwenspark.engines import vllm as engines_vllm

    own = engines_vllm.sampling_params

    def detokenizing(cfg: EngineConfig, *, final_only: bool = False) -> dict[Any, Any]:
        params = own(cfg, final_only=final_only)
        for p in params.values():
            p.detokenize = True
        return params

    engines_vllm.sampling_params = detokenizing  # type: ignore[assignment]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), help="dummy weights of this published shape")
    p.add_argument("--tokenizer", type=Path, help="tokenizer folder (with --shape)")
    p.add_argument("--model", help="a model folder with real weights instead of --shape")
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv")
    p.add_argument("--reviews", type=int, default=20_000, help="reviews through the executor function")
    p.add_argument("--bare-reviews", type=int, default=2048, help="reviews through the bare LLM.generate")
    p.add_argument("--bare", choices=("llm", "engine"), default="llm",
                   help="llm: a plain vllm.LLM loaded for the bare run; engine: the job engine's generate()")
    p.add_argument("--en-share", type=float, default=0.4)
    p.add_argument("--strategies", default="v1", help="comma list of prompt versions, one engine each")
    p.add_argument("--lengths-from", required=True,
                   help="comma list VERSION=EVAL.json: the real CPU eval whose tokens_out_percentiles it forces")
    p.add_argument("--quantization", choices=["fp8"], help="weights quantized on load (default: bf16)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--max-in-flight", type=int, default=256)
    p.add_argument("--frame-rows", type=int, default=1000, help="rows per incoming frame (Arrow batch)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--gpu-memory", type=float, default=0.85,
                   help="vLLM's gpu_memory_utilization (less when a service shares the GPU)")
    p.add_argument("--max-num-batched-tokens", type=int,
                   help="vLLM's token budget per step (default: vLLM's, 16,384 on an H200; less keeps the steps of "
                        "a service beside the batch short)")
    p.add_argument("--unguided-valid", type=float, default=0.95,
                   help="optimistic strategies: share of first answers written without the grammar that fit it (1 - "
                        "repaired_rate of a real CPU eval of the strategy); the rest are retried with the grammar")
    p.add_argument("--detokenize", choices=("final", "each"), default="final",
                   help="final: the engine's answers decoded once finished (the job's setting); each: vLLM detokenises "
                        "every token as it is decoded (the job before; to measure the lever)")
    p.add_argument("--env", action="append", default=[], type=lambda kv: tuple(kv.split("=", 1)), metavar="NAME=VALUE",
                   help="the GPU engine's engine.env (e.g. OMP_NUM_THREADS=16: the pool engines.vllm.GPU_ENV caps)")
    p.add_argument("--yield-to-service", type=float, default=0.0,
                   help="engine.yield_to_service: the executor phase's engine stands still this share of the time "
                        "while a service on this host has answers in flight (bench/serve_latency.py --alongside)")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    if args.detokenize == "each":
        detokenize_each_token()
    tables = {k: json.loads(Path(v).read_text())["tokens_out_percentiles"]
              for k, v in (item.split("=", 1) for item in args.lengths_from.split(","))}
    model = str(shaped_model(args.shape, args.tokenizer, Path("/tmp") / f"qwenspark-{args.shape}")) if args.shape \
        else args.model
    engine_kwargs: dict[str, Any] = {"load_format": "dummy"} if args.shape else {}
    if args.quantization:
        engine_kwargs["quantization"] = args.quantization
    if args.max_num_batched_tokens:
        engine_kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    reviews = sample_reviews(args.data, max(args.reviews, args.bare_reviews, 64), args.en_share)
    figures: dict[str, Any] = {"model": args.shape or model, "device": _device_name(),
                               "mean_review_chars": round(float(reviews["text"].str.len().mean()), 1),
                               "en_share": args.en_share, "engine_env": dict(args.env), "strategies": []}
    for name in args.strategies.split(","):
        version, share = strategy(name)
        row = run_strategy(args, version, reviews, lengths_table=tables[name.partition("@")[0].split("-")[0]],
                           model=model, engine_kwargs=engine_kwargs,
                           valid_share=args.unguided_valid if share is None else share)
        figures["strategies"].append(row)
        print(json.dumps(row), flush=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(figures, indent=2))
    print(f"\n{figures['model']} on {figures['device']}, reviews of {figures['mean_review_chars']} chars on average")
    print(f"  {'strategy':<12}{'precision':>10}{'reviews/s':>10}{'bare':>8}{'exec/bare':>10}{'out tok/s':>10}"
          f"{'tok/review':>11}{'HBM %':>7}{'compute %':>10}{'min/100k':>9}")
    for r in figures["strategies"]:
        print(f"  {r['strategy']:<12}{r['quantization']:>10}{r['exec_reviews_per_s']:>10}{r['bare_reviews_per_s']:>8}"
              f"{r['exec_vs_bare']:>10}{r['exec_out_tok_per_s']:>10}{r['mean_tokens_out']:>11}"
              f"{100 * r.get('share_of_hbm_bound', 0):>7.1f}{100 * r.get('share_of_compute_bound', 0):>10.1f}"
              f"{r['projected_min_per_100k']:>9}")
    print(f"  target: {TARGET_REVIEWS} reviews in {TARGET_MINUTES:.0f} min = "
          f"{TARGET_REVIEWS / TARGET_MINUTES / 60:.0f} reviews/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
