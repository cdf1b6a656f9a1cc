"""How often a model's answers written without the grammar fit it (optimistic versions: v11, v13), and why not.

    .venv/bin/python bench/unguided_fit.py [--model DIR] [--rows 40] [--versions v13,v11]

The share that fits decides what optimistic decoding costs on a GPU (bench/workload_100k.py --unguided-valid): every
misfit is generated again with the grammar. Each answer is read as the job reads it (parse_completion, then the
checks the grammar would have made: grammar_misfit) and counted under the first reason it fails.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.analyze import templated  # noqa: E402
from qwenspark.config import load_config  # noqa: E402
from qwenspark.engines import build_engine  # noqa: E402
from qwenspark.parse import grammar_misfit, needs_repair, parse_completion  # noqa: E402
from qwenspark.prompts import detect_lang, get_template  # noqa: E402


def reasons(version: str, model: str, reviews: pd.DataFrame) -> collections.Counter[str]:
    """Each answer's first misfit reason ("fits" when it has none), counted."""
    template = get_template(version)
    base = load_config(ROOT / "conf" / "local.yaml").engine.model_copy(update={"model": model, "max_tokens": 256})
    cfg = templated(base, version).model_copy(update={"optimistic": True})  # the first attempt, without the grammar
    langs = [detect_lang(t, g) for t, g in zip(reviews["text"], reviews["lang"], strict=True)]
    engine = build_engine(cfg)
    try:
        done = engine.generate([template.messages(t, g) for t, g in zip(reviews["text"], langs, strict=True)], langs)
    finally:
        engine.close()
    counted: collections.Counter[str] = collections.Counter()
    for answer, lang in zip(done, langs, strict=True):
        parsed = parse_completion(answer.text, answer.finish_reason, template.aspect_map, template.answer_format)
        if needs_repair(answer.finish_reason, parsed):
            counted["cut or looping"] += 1
        elif parsed.record is None:
            counted[(parsed.error or "").split(":")[1].strip() or "parse"] += 1
        else:
            counted[grammar_misfit(parsed.record, lang, cfg.summary_max_chars, cfg.summary_script) or "fits"] += 1
    return counted


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", default=str(ROOT / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct"))
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv")
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--versions", default="v13")
    args = p.parse_args()
    reviews = pd.read_csv(args.data).dropna(subset=["text"]).sample(args.rows, random_state=args.seed)
    for version in args.versions.split(","):
        counted = reasons(version, args.model, reviews)
        print(f"{version} {Path(args.model).name}: {counted['fits']} of {args.rows} fit; "
              + ", ".join(f"{k}: {v}" for k, v in counted.most_common() if k != "fits"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
