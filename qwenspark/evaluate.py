"""`qwenspark eval`: the same pipeline (through Spark) on a labelled CSV; accuracy, macro-F1, speed."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from qwenspark.analyze import Metrics
from qwenspark.clean import clean
from qwenspark.config import QwenSparkConfig
from qwenspark.errors import SourceError
from qwenspark.pipeline import analyse, new_metrics
from qwenspark.schemas import INPUT_SCHEMA

LABEL_COLUMNS = ("source_id", "lang", "text", "label")


@dataclass
class EvalReport:
    """Figures of one eval run (printed as a table, or as one JSON line with --json)."""

    rows: int
    accuracy: float
    accuracy_by_lang: dict[str, float]
    rows_by_lang: dict[str, int]
    macro_f1: float
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


def load_labelled(path: Path, limit: int | None, seed: int = 0) -> pd.DataFrame:
    """Read the CSV; with limit, a seeded sample split evenly across languages."""
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError) as exc:
        raise SourceError(f"eval: cannot read {path}: {exc}") from exc
    missing = [c for c in LABEL_COLUMNS if c not in df.columns]
    if missing:
        raise SourceError(f"eval: {path} lacks columns {missing}")
    if limit is not None and limit < len(df):
        langs = sorted(df["lang"].unique())
        per = [limit // len(langs) + (1 if i < limit % len(langs) else 0) for i in range(len(langs))]
        parts = [
            df[df["lang"] == lang].sample(frac=1.0, random_state=seed).head(n)
            for lang, n in zip(langs, per, strict=True)
        ]
        df = pd.concat(parts, ignore_index=True)
    return df.reset_index(drop=True)


def macro_f1(truth: list[str], pred: list[str | None]) -> float:
    """Macro-F1 over the labels that occur in truth (a prediction outside them counts as a miss)."""
    scores = []
    for label in sorted(set(truth)):
        tp = sum(t == label and p == label for t, p in zip(truth, pred, strict=True))
        fp = sum(t != label and p == label for t, p in zip(truth, pred, strict=True))
        fn = sum(t == label and p != label for t, p in zip(truth, pred, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / len(scores) if scores else 0.0


def _warm_up(spark: SparkSession, cfg: QwenSparkConfig) -> float:
    # Load the engine in the worker first, so rows/s measures analysis, not model loading.
    t0 = time.perf_counter()
    one = spark.createDataFrame([(0, "H0", None, "en", 5, "Nice room.")], INPUT_SCHEMA)
    analyse(clean(one, cfg), cfg).collect()
    return time.perf_counter() - t0


def run_eval(spark: SparkSession, cfg: QwenSparkConfig, labelled: pd.DataFrame) -> EvalReport:
    """Analyse the labelled rows through Spark and score the predictions."""
    load_s = _warm_up(spark, cfg)
    rows = [(i, "eval", None, r.lang or None, None, r.text) for i, r in enumerate(labelled.itertuples(index=False))]
    df = clean(spark.createDataFrame(rows, INPUT_SCHEMA), cfg)
    metrics: Metrics = new_metrics(spark)
    t0 = time.perf_counter()
    try:
        out = analyse(df, cfg, metrics).select("review_id", "sentiment", "error", "tokens_out").toPandas()
    finally:
        metrics.release()
    seconds = time.perf_counter() - t0
    out = out.sort_values("review_id").reset_index(drop=True)
    if len(out) != len(labelled):
        raise AssertionError(f"eval: {len(labelled)} rows in, {len(out)} out")
    truth = labelled["label"].tolist()
    pred = [p if isinstance(p, str) else None for p in out["sentiment"]]
    langs = labelled["lang"].tolist()
    by_lang = {
        lang: sum(t == p for t, p, g in zip(truth, pred, langs, strict=True) if g == lang) / langs.count(lang)
        for lang in sorted(set(langs))
    }
    n = len(labelled)
    errors = int(out["error"].notna().sum())
    return EvalReport(
        rows=n,
        accuracy=sum(t == p for t, p in zip(truth, pred, strict=True)) / n,
        accuracy_by_lang=by_lang,
        rows_by_lang={lang: langs.count(lang) for lang in sorted(set(langs))},
        macro_f1=macro_f1(truth, pred),
        schema_valid_rate=sum(p is not None for p in pred) / n,
        error_rate=errors / n,
        rows_per_s=n / seconds,
        gen_tokens_per_s=float(out["tokens_out"].sum()) / seconds,
        seconds=seconds,
        engine_load_seconds=load_s,
        model=cfg.engine.model,
        prompt_version=cfg.prompt.version,
    )
