"""Human-readable summaries printed at the end of `batch` and `eval`."""

from __future__ import annotations

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
    """The eval figures as a small table."""
    print(f"\nqwenspark eval: {r.rows} rows, model {r.model}, prompt {r.prompt_version}")
    for lang, acc in r.accuracy_by_lang.items():
        print(f"  accuracy[{lang}]      {acc:.3f}  ({r.rows_by_lang[lang]} rows)")
    print(f"  accuracy          {r.accuracy:.3f}")
    print(f"  macro-F1          {r.macro_f1:.3f}")
    print(f"  schema-valid      {r.schema_valid_rate:.3f}")
    print(f"  error rate        {r.error_rate:.3f}")
    print(f"  rows/s            {r.rows_per_s:.2f}")
    print(f"  gen tokens/s      {r.gen_tokens_per_s:.1f}")
    print(f"  analysis seconds  {r.seconds:.1f} (engine load + warm-up {r.engine_load_seconds:.1f} s before)")
