"""Human-readable summaries printed at the end of `batch` and `eval`."""

from __future__ import annotations

from typing import Any

from qwenspark.config import QwenSparkConfig
from qwenspark.evaluate import EvalReport
from qwenspark.pipeline import RunSummary
from qwenspark.stream import StreamReport


def print_summary(cfg: QwenSparkConfig, s: RunSummary) -> None:
    """What the run did, where the results are and how to look at them."""
    db = cfg.db
    rate = s.rows_analysed / s.seconds_analyse if s.seconds_analyse else 0.0
    tok_rate = s.tokens_out / s.seconds_analyse if s.seconds_analyse else 0.0
    print(
        f"""
qwenspark run {s.run_id}: {s.status}
  reviews selected     {s.rows_selected}
  already current      {s.rows_skipped}  (same text, model and prompt: skipped)
  analysed             {s.rows_analysed}  ({s.rows_ok} ok, {s.rows_error} with an error, {s.rows_truncated} truncated)
  guarded              {s.rows_guarded}  (instructions to the model cut from the review first: prompt.guard)
  generated again      {s.rows_repaired}  (answers cut or looping, misfitting the grammar, or an engine fault)
  result rows changed  {s.rows_changed}
  stale, not written   {s.rows_stale}  (a run that read newer input had stored them)
  results purged       {s.rows_purged}  (reviews deleted from {cfg.source.table}; job.purge_deleted)
  engine               {cfg.engine.kind} {cfg.engine.model}
                       loaded {s.engine_loads}x, {s.engine_batches} batches, sizes {s.batch_sizes or "-"}
  throughput           {rate:.2f} reviews/s, {tok_rate:.1f} generated tokens/s (analysis stage)
  wall time            {s.seconds_total:.1f} s
Results: MySQL {db.host}:{db.port}, database {db.database}
  tables  review_sentiment, hotel_sentiment_daily, aspect_sentiment, sentiment_daily_lang, aspect_daily_lang,
          sentiment_monthly_lang, aspect_monthly_lang, job_runs
  views   v_sentiment_mix, v_sentiment_trend_daily, v_hotel_sentiment, v_aspect_sentiment
  try     make sql Q="SELECT * FROM v_hotel_sentiment"
          make sql Q="SELECT review_id, sentiment, summary FROM review_sentiment LIMIT 10"
"""
    )


def print_stream(cfg: QwenSparkConfig, r: StreamReport) -> None:
    """What the streaming query did while this driver ran it."""
    st = cfg.stream
    print(
        f"""
qwenspark stream {st.query_name} (query id {r.query_id}, source {st.source}, checkpoint {st.checkpoint_location})
  micro-batches committed  {r.batches_committed}  (+{r.batches_replayed} replays found committed and skipped)
  rows in                  {r.rows_in}  ({r.rows_analysed} analysed, {r.rows_rejected} rejected: see stream_rejects)
  engine loads             {r.engine_loads}  (keepalive probes while idle: {r.keepalive_probes})
  runs abandoned earlier   {r.runs_abandoned}  (replayed)
  ledger                   make sql Q="SELECT * FROM stream_commits ORDER BY committed_at DESC LIMIT 10"
"""
    )


def print_eval(r: EvalReport) -> None:
    """The eval figures: per language accuracy, per-class precision/recall/F1 and the confusion matrix, then the
    answer quality and speed figures and the slowest rows."""
    print(f"\nqwenspark eval: {r.rows} rows, model {r.model}, prompt {r.prompt_version}")
    for lang, acc in r.accuracy_by_lang.items():
        print(f"\n  [{lang}] {r.rows_by_lang[lang]} rows: accuracy {acc:.3f}, macro-F1 {r.macro_f1_by_lang[lang]:.3f}")
        print(f"    {'gold class':12} {'precision':>9} {'recall':>7} {'F1':>6} {'support':>8}")
        for label, c in r.per_class_by_lang[lang].items():
            print(f"    {label:12} {c['precision']:>9.3f} {c['recall']:>7.3f} {c['f1']:>6.3f} {int(c['support']):>8}")
        answers = list(next(iter(r.confusion_by_lang[lang].values())))
        print(f"    {'gold / answer':14}" + "".join(f"{a:>10}" for a in answers))
        for gold, row in r.confusion_by_lang[lang].items():
            print(f"    {gold:14}" + "".join(f"{row[a]:>10}" for a in answers))
    table = r.tokens_out_percentiles  # 101 points (21 in reports before stop 50)
    spread = "/".join(str(table[round(q * (len(table) - 1) / 100)]) for q in (10, 50, 90))
    bound_by_lang = ", ".join(f"{lang} {v:.3f}" for lang, v in r.summary_at_bound_by_lang.items())
    print(f"""
  accuracy            {r.accuracy:.3f}   (mixed scores as neutral against star labels: qwenspark.scoring)
  macro-F1            {r.macro_f1:.3f}
  schema-valid        {r.schema_valid_rate:.3f}
  error rate          {r.error_rate:.3f}
  summary in language {r.summary_in_language_rate:.3f}
  summary copied      {r.summary_copied_rate:.3f} (mostly one verbatim stretch of the review)
  summary at bound    {r.summary_at_bound_rate:.3f} (stopped at the version's bound, ended with "…"; {bound_by_lang})
  summary borrowed    {r.summary_borrowed_rate:.3f} (a stretch of a few-shot example's summary the review lacks)
  cut or looping      {r.cut_or_looping_rate:.4f}
  generated again     {r.repaired_rate:.4f} (cut or looping, misfitting the grammar, or ended by the engine in an error)
  tokens out / review {r.mean_tokens_out:.1f} (p10/p50/p90 {spread})
  rows/s              {r.rows_per_s:.2f}
  gen tokens/s        {r.gen_tokens_per_s:.1f}
  analysis seconds    {r.seconds:.1f} (engine load + warm-up {r.engine_load_seconds:.1f} s before)""")
    print("  slowest rows        " + ", ".join(f"{x['source_id']} ({x['latency_ms']} ms, {x['tokens_out']} tokens)"
                                              for x in r.slowest))


# The figures --compare sets side by side: (label, path into the report's JSON).
_COMPARED: list[tuple[str, tuple[str, ...]]] = [
    ("rows", ("rows",)), ("accuracy", ("accuracy",)), ("macro-F1", ("macro_f1",)),
    ("schema-valid", ("schema_valid_rate",)), ("summary in language", ("summary_in_language_rate",)),
    ("summary copied", ("summary_copied_rate",)), ("summary at bound", ("summary_at_bound_rate",)),
    ("summary borrowed", ("summary_borrowed_rate",)),
    ("cut or looping", ("cut_or_looping_rate",)), ("generated again", ("repaired_rate",)),
    ("tokens out / review", ("mean_tokens_out",)),
    ("rows/s", ("rows_per_s",))]


def dig(report: Any, path: tuple[str, ...]) -> Any:
    """The value at path in an eval report's JSON, or None where it has none."""
    for key in path:
        report = report.get(key) if isinstance(report, dict) else None
    return report


def print_compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str]) -> None:
    """Two eval reports (their JSON) side by side, with B - A."""
    rows: list[tuple[str, tuple[str, ...]]] = [("model", ("model",)), ("prompt", ("prompt_version",)), *_COMPARED]
    for lang in sorted(set(a.get("accuracy_by_lang", {})) | set(b.get("accuracy_by_lang", {}))):
        rows.append((f"accuracy[{lang}]", ("accuracy_by_lang", lang)))
        rows.append((f"macro-F1[{lang}]", ("macro_f1_by_lang", lang)))
        classes = set(dig(a, ("per_class_by_lang", lang)) or {}) | set(dig(b, ("per_class_by_lang", lang)) or {})
        rows += [(f"F1[{lang}:{label}]", ("per_class_by_lang", lang, label, "f1")) for label in sorted(classes)]
    width = max(12, *(len(n) + 2 for n in names))
    print(f"{'':22}{names[0]:>{width}}{names[1]:>{width}}{'B - A':>10}")
    for label, path in rows:
        x, y = dig(a, path), dig(b, path)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        delta = f"{y - x:+.3f}" if numbers else ""
        print(f"{label:22}{_fmt(x):>{width}}{_fmt(y):>{width}}{delta:>10}")


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if isinstance(x, float) else str(x)
