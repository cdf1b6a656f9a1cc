"""Insert -> result latency of the streaming job at a steady insert rate (one run, real Spark + MariaDB + model).

Reviews from the dev set are inserted one per transaction at --rate per second for --seconds, while the
streaming job runs in this process (a fresh checkpoint, starting after the newest review). The latency of a
review is the database time of its batch's commit (stream_commits.committed_at) minus the database time
right after its insert committed: both read from the same server clock.

    make db && .venv/bin/python bench/stream_latency.py --rate 0.25 --seconds 180
    .venv/bin/python -m tests.support.tiny_model .cache/test-models/tiny-qwen3     # the tiny test model, once
    .venv/bin/python bench/stream_latency.py --set engine.model=.cache/test-models/tiny-qwen3 \
        --set engine.default_model=false --rate 2 --seconds 60      # pipeline overhead with a tiny model

The rows it inserted (hotel_id BENCH-STREAM) are deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

from qwenspark.config import QwenSparkConfig, load_config
from qwenspark.io import migrate, mysql
from qwenspark.pipeline import prepare_model
from qwenspark.session import spark_session
from qwenspark.stream import StreamReport, run_stream

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT.parent / "shared" / "data" / "hotel_reviews" / "reviews_dev.csv"
HOTEL = "BENCH-STREAM"


def _insert(cfg: QwenSparkConfig, review_id: int, text: str, lang: str) -> datetime:
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:  # the application's write
        cur.execute(
            "INSERT INTO hotel_reviews (review_id, hotel_id, created_at, lang, rating, text)"
            " VALUES (%s, %s, UTC_TIMESTAMP(), %s, NULL, %s)",
            (review_id, HOTEL, lang, text),
        )
        cur.execute("SELECT UTC_TIMESTAMP(3)")
        return cur.fetchone()[0]  # type: ignore[no-any-return]


def _done(cfg: QwenSparkConfig, ids: list[int]) -> dict[int, datetime]:
    marks = ",".join(str(i) for i in ids)
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT r.review_id, c.committed_at FROM review_sentiment r JOIN stream_commits c ON c.run_id = r.run_id"
            f" WHERE r.review_id IN ({marks})"
        )
        return {int(rid): ts for rid, ts in cur.fetchall()}


def _cleanup(cfg: QwenSparkConfig, ids: list[int]) -> None:
    marks = ",".join(str(i) for i in ids)
    with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:
        for table in ("review_sentiment", "hotel_reviews"):
            cur.execute(f"DELETE FROM {table} WHERE review_id IN ({marks})")
        for table in ("hotel_sentiment_daily", "aspect_sentiment", "sentiment_daily_lang", "aspect_daily_lang"):
            cur.execute(f"DELETE FROM {table} WHERE hotel_id = %s", (HOTEL,))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "conf" / "local.yaml"))
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--rate", type=float, default=0.25, help="reviews inserted per second")
    p.add_argument("--seconds", type=float, default=180.0, help="how long to insert")
    p.add_argument("--trigger", type=float, default=2.0, help="stream.trigger_seconds")
    p.add_argument("--keep", action="store_true", help="keep the inserted rows and their results")
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    checkpoint = tempfile.mkdtemp(prefix="qwenspark-bench-stream-")
    cfg = load_config(args.config, args.overrides)
    migrate.migrate(cfg.db)
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT COALESCE(MAX(review_id), 0) FROM hotel_reviews")
        next_id = int(cur.fetchone()[0]) + 1
    # An explicit start (not "latest", which the query resolves when it starts: after our first insert, maybe).
    cfg = prepare_model(load_config(args.config, [
        *args.overrides,
        f"stream.checkpoint_location={checkpoint}",
        f"stream.trigger_seconds={args.trigger}",
        f"stream.start_after_id={next_id - 1}",
        "stream.query_name=bench_stream_latency",
    ]))
    dev = pd.read_csv(DEV, dtype=str, keep_default_na=False).sample(frac=1.0, random_state=0)
    texts = list(zip(dev.text, dev.lang, strict=True))

    spark = spark_session(cfg)
    stop = threading.Event()
    out: dict[str, StreamReport] = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", run_stream(spark, cfg, stop)), daemon=True)
    thread.start()
    ids: list[int] = []
    inserted: dict[int, datetime] = {}
    try:
        # Warm-up: the first review loads the engine; it is not counted.
        warm = next_id
        _insert(cfg, warm, *texts[0])
        ids.append(warm)
        t0 = time.monotonic()
        while not _done(cfg, [warm]):
            if time.monotonic() - t0 > 900:
                raise SystemExit("the warm-up review never came out")
            time.sleep(0.5)
        print(f"engine warm after {time.monotonic() - t0:.1f} s; inserting {args.rate}/s for {args.seconds:.0f} s",
              file=sys.stderr)
        n = int(args.rate * args.seconds)
        start = time.monotonic()
        for k in range(n):
            time.sleep(max(0.0, start + k / args.rate - time.monotonic()))
            rid = next_id + 1 + k
            inserted[rid] = _insert(cfg, rid, *texts[(k + 1) % len(texts)])
            ids.append(rid)
        deadline = time.monotonic() + 900
        while len(_done(cfg, list(inserted))) < len(inserted) and time.monotonic() < deadline:
            time.sleep(1.0)
        finished = _done(cfg, list(inserted))
    finally:
        stop.set()
        thread.join(timeout=120)
        if not args.keep and ids:
            _cleanup(cfg, ids)
        spark.stop()

    lat = sorted((finished[i] - inserted[i]).total_seconds() for i in inserted if i in finished)
    report = out.get("r")
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else lat * 99
    result = {
        "model": cfg.engine.model,
        "rate_per_s": args.rate,
        "seconds": args.seconds,
        "trigger_s": args.trigger,
        "reviews": len(inserted),
        "results": len(finished),
        "missing": len(inserted) - len(finished),
        "latency_p50_s": round(q[49], 2) if lat else None,
        "latency_p90_s": round(q[89], 2) if lat else None,
        "latency_max_s": round(lat[-1], 2) if lat else None,
        "batches": report.batches_committed if report else None,
        "engine_loads": report.engine_loads if report else None,
    }
    print(json.dumps(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if not result["missing"] else 1


if __name__ == "__main__":
    sys.exit(main())
