"""`qwenspark eval`: the same pipeline (through Spark) on a labelled CSV; per-language and per-class quality, speed."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from qwenspark import scoring
from qwenspark.analyze import Metrics
from qwenspark.clean import clean
from qwenspark.config import QwenSparkConfig
from qwenspark.errors import SourceError
from qwenspark.parse import CUT_ERROR
from qwenspark.pipeline import analyse, new_metrics
from qwenspark.prompts import get_template
from qwenspark.schemas import INPUT_SCHEMA

LABEL_COLUMNS = ("source_id", "lang", "text", "label")


@dataclass
class EvalReport:
    """Figures of one eval run (a table, or one JSON line with --json); the scoring rules: qwenspark.scoring."""

    rows: int
    accuracy: float
    accuracy_by_lang: dict[str, float]
    rows_by_lang: dict[str, int]
    macro_f1: float
    macro_f1_by_lang: dict[str, float]
    per_class_by_lang: dict[str, dict[str, dict[str, float]]]  # lang -> gold class -> precision/recall/f1/support
    confusion_by_lang: dict[str, dict[str, dict[str, int]]]  # lang -> gold -> raw answer (4 labels, error) -> rows
    summary_in_language_rate: float  # of the rows with a summary in zh or en
    summary_copied_rate: float  # of the rows with a summary: mostly one verbatim stretch of the review (scoring.copied)
    # Of the rows with a summary: stopped at the prompt version's bound and stored ended at a clause with "…"
    # (parse.ended_summary): what the dashboard shows as an unfinished line.
    summary_at_bound_rate: float
    summary_at_bound_by_lang: dict[str, float]
    # Of the rows with a summary: a stretch of a few-shot example's summary that the review lacks (scoring.borrowed)
    summary_borrowed_rate: float
    summary_borrowed: list[dict[str, object]]  # those rows: source_id, lang, summary
    cut_or_looping_rate: float  # answers cut by max_tokens, or with a degenerate repetition in the summary
    cut_or_looping: list[dict[str, object]]  # those rows: source_id, lang, tokens_out, summary (cut: None)
    repaired_rate: float  # answers generated again (cut or looping, misfitting the grammar, or an engine fault)
    mean_tokens_out: float
    # Output tokens per review at the 0th, 1st, ..., 100th percentile: the length distribution a GPU benchmark
    # forces on dummy weights (bench/workload_100k.py, bench/device/serve_planned.py), so its decode work looks like
    # real answers. A point a percent since stop 50 (before: 21, a 5th apart, so the longest 5 % were drawn between
    # the 95th percentile and the one longest answer, which set a service's P99 answer length by itself).
    tokens_out_percentiles: list[int]
    slowest: list[dict[str, object]]  # the 5 slowest rows: source_id, lang, latency_ms, tokens_out
    schema_valid_rate: float
    error_rate: float
    rows_per_s: float
    gen_tokens_per_s: float
    seconds: float
    engine_load_seconds: float
    model: str
    prompt_version: str

    def as_dict(self) -> dict[str, object]:
        """Plain dict for JSON."""
        return asdict(self)


def load_labelled(path: Path, limit: int | None, seed: int = 0,
                  exclude: Sequence[tuple[int, int]] = ()) -> pd.DataFrame:
    """Read the CSV; with limit, a seeded sample split evenly across languages. exclude: (limit, seed) pairs of
    samples (as this function draws them from the whole CSV) whose rows are left out first, so that a report can be
    made on rows that were not used to choose a prompt or a model."""
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError) as exc:
        raise SourceError(f"eval: cannot read {path}: {exc}") from exc
    missing = [c for c in LABEL_COLUMNS if c not in df.columns]
    if missing:
        raise SourceError(f"eval: {path} lacks columns {missing}")
    used = {sid for n, s in exclude for sid in sample(df, n, s)["source_id"]}
    df = df[~df["source_id"].isin(used)]
    return sample(df, limit, seed)


def sample(df: pd.DataFrame, limit: int | None, seed: int) -> pd.DataFrame:
    """A seeded sample of limit rows split evenly across languages (all rows without limit)."""
    if limit is not None and limit < len(df):
        langs = sorted(df["lang"].unique())
        per = [limit // len(langs) + (1 if i < limit % len(langs) else 0) for i in range(len(langs))]
        parts = [
            df[df["lang"] == lang].sample(frac=1.0, random_state=seed).head(n)
            for lang, n in zip(langs, per, strict=True)
        ]
        df = pd.concat(parts, ignore_index=True)
    return df.reset_index(drop=True)


def _warm_up(spark: SparkSession, cfg: QwenSparkConfig) -> float:
    # Load the engine in the worker first, so rows/s measures analysis, not model loading.
    t0 = time.perf_counter()
    one = spark.createDataFrame([(0, "H0", None, "en", 5, "Nice room.")], INPUT_SCHEMA)
    analyse(clean(one, cfg), cfg).collect()
    return time.perf_counter() - t0


def run_eval(spark: SparkSession, cfg: QwenSparkConfig, labelled: pd.DataFrame,
             rows_out: Path | None = None) -> EvalReport:
    """Analyse the labelled rows through Spark and score the predictions; with rows_out, also write each row's answer
    and flags there as CSV (answer_rows)."""
    load_s = _warm_up(spark, cfg)
    rows = [(i, "eval", None, r.lang or None, None, r.text) for i, r in enumerate(labelled.itertuples(index=False))]
    df = clean(spark.createDataFrame(rows, INPUT_SCHEMA), cfg)
    metrics: Metrics = new_metrics(spark)
    t0 = time.perf_counter()
    try:
        out = analyse(df, cfg, metrics).select(
            "review_id", "sentiment", "summary", "aspects", "error", "tokens_out", "latency_ms").toPandas()
        repaired = int(metrics.repaired.value)
    finally:
        metrics.release()
    seconds = time.perf_counter() - t0
    out = out.sort_values("review_id").reset_index(drop=True)
    if len(out) != len(labelled):
        raise AssertionError(f"eval: {len(labelled)} rows in, {len(out)} out")
    if rows_out is not None:
        answer_rows(labelled, out, cfg.prompt.version).to_csv(rows_out, index=False, encoding="utf-8")
    return score(labelled, out, seconds=seconds, engine_load_seconds=load_s, model=cfg.engine.model,
                 prompt_version=cfg.prompt.version, repaired=repaired)


def _none(x: object) -> str | None:
    return x if isinstance(x, str) else None


def _rate(flags: Sequence[bool | None]) -> float:
    """The share of True among the flags that are not None (0.0 when none is)."""
    known = [f for f in flags if f is not None]
    return sum(known) / len(known) if known else 0.0


def at_bound(summary: str | None) -> bool | None:
    """Whether a stored summary was stopped at its bound (parse.ended_summary ends it with "…"); None without one."""
    return summary.endswith("…") if summary else None


def summary_flags(summaries: Sequence[str | None], texts: Sequence[str],
                  prompt_version: str) -> dict[str, list[bool | None]]:
    """Per summary (None where there is none): mostly copied from its review (scoring.copied), borrowed from a few-shot
    example (scoring.borrowed), stopped at its bound (at_bound); what the report counts and --rows-out lists."""
    shown = get_template(prompt_version).example_summaries()
    return {
        "copied": [scoring.copied(s, t) for s, t in zip(summaries, texts, strict=True)],
        "borrowed": [scoring.borrowed(s, t, shown) for s, t in zip(summaries, texts, strict=True)],
        "at_bound": [at_bound(s) for s in summaries],
    }


def answer_rows(labelled: pd.DataFrame, out: pd.DataFrame, prompt_version: str) -> pd.DataFrame:
    """One row per labelled review (in its order): id, language, gold label, the review, the stored answer (label as
    generated, summary, aspects, error, tokens) and the flags the report counts (correct under the language's scheme,
    summary copied, borrowed, at its bound); what `eval --rows-out` writes, to read the rows behind the figures."""
    langs, summaries = labelled["lang"].tolist(), [_none(x) for x in out["summary"]]
    texts, answers = labelled["text"].tolist(), [_none(a) for a in out["sentiment"]]
    classes = {lang: scoring.scheme(labelled.loc[labelled["lang"] == lang, "label"].tolist()) for lang in set(langs)}
    return pd.DataFrame({
        "source_id": labelled["source_id"].tolist(), "lang": langs, "label": labelled["label"].tolist(),
        "sentiment": answers,
        "correct": [scoring.scored(a, classes[lang]) == g
                    for a, lang, g in zip(answers, langs, labelled["label"], strict=True)],
        "summary": summaries, "aspects": [_none(x) for x in out["aspects"]],
        "error": [_none(x) for x in out["error"]], "tokens_out": out["tokens_out"].tolist(),
        **summary_flags(summaries, texts, prompt_version),
        "text": texts,
    })


def score(labelled: pd.DataFrame, out: pd.DataFrame, *, seconds: float, engine_load_seconds: float, model: str,
          prompt_version: str, repaired: int = 0) -> EvalReport:
    """The report of predictions `out` (sentiment, summary, error, tokens_out, latency_ms; row i answers labelled
    row i) against the gold labels, each language under its own scheme (qwenspark.scoring)."""
    gold, langs = labelled["label"].tolist(), labelled["lang"].tolist()
    answers = [_none(a) for a in out["sentiment"]]
    summaries, errors = [_none(x) for x in out["summary"]], [_none(x) for x in out["error"]]
    by_lang = {lang: [i for i, g in enumerate(langs) if g == lang] for lang in sorted(set(langs))}
    per_lang = {lang: ([gold[i] for i in idx], [answers[i] for i in idx]) for lang, idx in by_lang.items()}
    classes = {lang: scoring.scheme(g) for lang, (g, _) in per_lang.items()}
    scored = [scoring.scored(a, classes[lang]) for a, lang in zip(answers, langs, strict=True)]
    per_class = {lang: scoring.per_class(g, a) for lang, (g, a) in per_lang.items()}
    in_lang = [scoring.in_language(s, lang) for s, lang in zip(summaries, langs, strict=True)]
    flags = summary_flags(summaries, labelled["text"].tolist(), prompt_version)
    borrows, bounded = flags["borrowed"], flags["at_bound"]
    cut = [bool(e and e.startswith(CUT_ERROR)) or scoring.looping(s) for e, s in zip(errors, summaries, strict=True)]
    n = len(labelled)
    tokens_out = [int(t) for t in out["tokens_out"].tolist()]
    slow = out.assign(source_id=labelled["source_id"].values, lang=labelled["lang"].values).nlargest(5, "latency_ms")
    slowest: list[dict[str, object]] = [
        {"source_id": str(r["source_id"]), "lang": str(r["lang"]), "latency_ms": int(r["latency_ms"]),
         "tokens_out": int(r["tokens_out"])} for r in slow.to_dict("records")]
    return EvalReport(
        rows=n,
        accuracy=sum(g == p for g, p in zip(gold, scored, strict=True)) / n,
        accuracy_by_lang={lang: scoring.accuracy(g, a) for lang, (g, a) in per_lang.items()},
        rows_by_lang={lang: len(idx) for lang, idx in by_lang.items()},
        macro_f1=scoring.macro_f1(scoring.per_class(gold, scored)),
        macro_f1_by_lang={lang: scoring.macro_f1(c) for lang, c in per_class.items()},
        per_class_by_lang={lang: {k: asdict(v) for k, v in c.items()} for lang, c in per_class.items()},
        confusion_by_lang={lang: scoring.confusion(g, a) for lang, (g, a) in per_lang.items()},
        summary_in_language_rate=_rate(in_lang),
        summary_copied_rate=_rate(flags["copied"]),
        summary_at_bound_rate=_rate(bounded),
        summary_at_bound_by_lang={lang: _rate([bounded[i] for i in idx]) for lang, idx in by_lang.items()},
        summary_borrowed_rate=_rate(borrows),
        summary_borrowed=[{"source_id": str(labelled["source_id"].iat[i]), "lang": langs[i], "summary": summaries[i]}
                          for i in range(n) if borrows[i]],
        cut_or_looping_rate=sum(cut) / n,
        repaired_rate=repaired / n,
        cut_or_looping=[
            {"source_id": str(labelled["source_id"].iat[i]), "lang": langs[i], "tokens_out": tokens_out[i],
             "summary": summaries[i]} for i in range(n) if cut[i]],
        mean_tokens_out=float(out["tokens_out"].mean()),
        tokens_out_percentiles=[round(float(out["tokens_out"].quantile(q / 100))) for q in range(101)],
        slowest=slowest,
        schema_valid_rate=sum(a is not None for a in answers) / n,
        error_rate=sum(e is not None for e in errors) / n,
        rows_per_s=n / seconds,
        gen_tokens_per_s=float(out["tokens_out"].sum()) / seconds,
        seconds=seconds,
        engine_load_seconds=engine_load_seconds,
        model=model,
        prompt_version=prompt_version,
    )
