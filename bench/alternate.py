"""Two sides of a throughput comparison timed in one run: warmed up, order alternated, medians reported."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

Side = Callable[[], tuple[float, int]]  # one timed run: (seconds, generated tokens)
Measured = tuple[dict[str, list[float]], dict[str, int], dict[str, float]]  # runs' seconds, tokens, medians


def arguments(doc: str, root: Path) -> argparse.ArgumentParser:
    """The options both comparisons take: rows, repeats, model folder, batch size, a JSON copy of the figures."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=str(root / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct"))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--json-out", type=Path, help="also write the figures here")
    return p


def demo_rows(root: Path, n: int) -> list[tuple[object, ...]]:
    """The first n demo reviews with text under 1,500 characters, as INPUT_SCHEMA tuples."""
    import pandas as pd

    demo = pd.read_csv(root / "data" / "demo" / "hotel_reviews_demo.csv", dtype=str, keep_default_na=False)
    demo = demo[(demo["text"].str.strip() != "") & (demo["text"].str.len() < 1500)].head(n)
    triples = zip(demo.hotel_id, demo.lang, demo.text, strict=True)
    return [(i, h, None, lang, None, t) for i, (h, lang, t) in enumerate(triples)]


def alternate(first: tuple[str, Side], second: tuple[str, Side], repeats: int) -> Measured:
    """Warm both sides once (engine loads, prompt prefixes), then run them `repeats` times in alternating order.

    Returns each side's seconds per run, its generated tokens in the last run and its median seconds.
    """
    first[1]()
    second[1]()
    times: dict[str, list[float]] = {first[0]: [], second[0]: []}
    tokens: dict[str, int] = {}
    for i in range(repeats):
        for name, run in (first, second) if i % 2 == 0 else (second, first):
            seconds, tokens[name] = run()
            times[name].append(round(seconds, 2))
            print(f"run {i + 1} {name}: {seconds:.1f} s", flush=True)
    return times, tokens, {name: statistics.median(values) for name, values in times.items()}


def report(first: str, second: str, measured: Measured, json_out: Path | None, **conditions: object
           ) -> dict[str, object]:
    """The figures of an alternate() run: every run, the tokens, and `<second>_vs_<first>` = the throughput
    ratio (first's median seconds / second's); printed as one JSON line and written to json_out if given."""
    import json

    times, tokens, median = measured
    ratio = round(median[first] / median[second], 3)
    figures: dict[str, object] = {
        **conditions, f"{first}_s": times[first], f"{second}_s": times[second],
        f"{first}_tokens": tokens[first], f"{second}_tokens": tokens[second], f"{second}_vs_{first}": ratio,
    }
    print(f"{second} vs {first}, median of {len(times[first])}: {ratio} ({first} {median[first]:.1f} s, "
          f"{second} {median[second]:.1f} s; target >= 0.97)")
    print(json.dumps(figures))
    if json_out:
        json_out.write_text(json.dumps(figures, indent=1) + "\n")
    return figures
