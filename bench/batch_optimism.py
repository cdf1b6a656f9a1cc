"""The executor function with an optimistic prompt version on a model whose unguided answers mostly misfit: always
optimistic (engine.optimistic_min_fit 0) against the rule (qwenspark/optimism.py), or (--sides always,uncut) against
always optimistic with each unguided answer written to its end (engine.cut_dead_ends off), in one run on one engine.

The embedded 0.5B writes v13's lines unguided so that about a fifth fit the grammar (serve_history.md, stop 35): always
optimistic, four in five reviews are written twice. The rule's window is shortened (--window) so that it judges within
the few dozen reviews a CPU run can afford, and batches are small (the rule decides per batch). Each side sees the same
reviews on its own copy (a run tag in each text, so neither reuses the other's prompt KV cache beyond the shared
prefix); the sides alternate, the first run of each untimed (warm-up; the rule's share is learned there).

    .venv/bin/python bench/batch_optimism.py --rows 32 --batch-size 4 --repeats 2 \\
        --json-out bench/results/batch_optimism_cpu.json
    .venv/bin/python bench/batch_optimism.py --rows 24 --batch-size 8 --repeats 2 --sides always,uncut \\
        --json-out bench/results/batch_dead_ends_cpu.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.alternate import arguments, demo_rows  # noqa: E402
from qwenspark.analyze import AnalyzeSpec, make_analyze_fn, templated  # noqa: E402
from qwenspark.config import load_config  # noqa: E402
from qwenspark.engines import build_engine  # noqa: E402


def main() -> int:
    p = arguments(__doc__ or "", ROOT)
    p.add_argument("--window", type=int, default=8, help="engine.optimistic_window of the rule's side")
    p.add_argument("--version", default="v13", help="an optimistic prompt version")
    p.add_argument("--sides", default="always,rule", help="two or more of always, rule, uncut; ratios to the first")
    args = p.parse_args()
    import pandas as pd

    cores = len(os.sched_getaffinity(0))
    cfg = load_config(ROOT / "conf" / "local.yaml", [
        f"engine.model={args.model}", "engine.default_model=false", f"engine.batch_size={args.batch_size}",
        f"prompt.version={args.version}", f"engine.optimistic_window={args.window}",
        f"engine.env.VLLM_CPU_OMP_THREADS_BIND=0-{cores - 1}", f"engine.env.OMP_NUM_THREADS={cores}"])
    settings = templated(cfg.engine, args.version)
    if not settings.optimistic:
        raise SystemExit(f"prompt {args.version} is not optimistic: nothing to compare")
    engine: Any = build_engine(settings)  # one engine for both sides: the same weights, threads and prefix cache
    rows = demo_rows(ROOT, args.rows)

    def frame(tag: str) -> pd.DataFrame:
        return pd.DataFrame({
            "review_id": range(len(rows)), "hotel_id": [r[1] for r in rows],
            "created_at": pd.Timestamp("2026-11-01"), "lang": [r[3] for r in rows],
            "text": [f"{r[5]} ({tag})" for r in rows], "input_key": "k", "clean_error": None})

    class Kept:
        """The one engine, under each side's settings (the engine cache closes an engine whose settings change)."""

        def __init__(self, cut: bool) -> None:
            self.cut = cut

        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        def close(self) -> None:
            pass

    # (engine.optimistic_min_fit, engine.cut_dead_ends) of each side
    known = {"always": (0.0, True), "rule": (cfg.engine.optimistic_min_fit, True), "uncut": (0.0, False)}
    names = args.sides.split(",")
    if len(names) < 2 or not set(names) <= set(known):
        raise SystemExit(f"--sides: two or more of {sorted(known)}")
    # One view per side, kept across its runs: the rule's share lives as long as the engine does (per process).
    views = {name: Kept(known[name][1]) for name in names}
    sides = {name: make_analyze_fn(AnalyzeSpec(
        engine=cfg.engine.model_copy(update={"optimistic_min_fit": known[name][0]}), prompt_version=args.version,
        max_review_tokens=cfg.clean.max_review_tokens), engine_factory=lambda _, view=views[name]: view)
        for name in names}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for repeat in range(args.repeats + 1):
        for name, fn in (sides.items() if repeat % 2 == 0 else reversed(sides.items())):
            # The engine reads its dead-end rule per request (VllmEngine._add): this side's, for this run.
            engine._cfg = engine._cfg.model_copy(update={"cut_dead_ends": views[name].cut})
            dead_before = engine.dead_ends
            started = time.perf_counter()
            out = pd.concat(list(fn(iter([frame(f"{name} {repeat}")]))))
            seconds = time.perf_counter() - started
            assert len(out) == len(rows)
            if repeat:  # the first run of each side warms it
                runs[name].append({"seconds": round(seconds, 2), "reviews_per_s": round(len(rows) / seconds, 3),
                                   "tokens_out_per_review": round(float(out["tokens_out"].mean()), 1),
                                   "dead_ends": engine.dead_ends - dead_before,
                                   "error_rows": int(out["error"].notna().sum())})
            print(name, repeat, round(seconds, 1), "s", file=sys.stderr, flush=True)
    engine.close()
    medians = {name: round(statistics.median(r["reviews_per_s"] for r in rs), 3) for name, rs in runs.items()}
    figures = {"model": Path(args.model).name, "prompt_version": args.version, "rows": len(rows),
               "batch_size": args.batch_size, "window": args.window, "min_fit": cfg.engine.optimistic_min_fit,
               "runs": runs, "median_reviews_per_s": medians,
               **{f"{name}_vs_{names[0]}": round(medians[name] / medians[names[0]], 3) for name in names[1:]}}
    print(json.dumps(figures))
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
