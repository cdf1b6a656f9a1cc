"""Dashboard API latency (p50/p95 per endpoint) and first page load, on demo-sized and on 1M generated results.

    .venv/bin/python bench/dashboard_latency.py [--rows 1000000] [--requests 30]

Starts its own throwaway MariaDB (a new .run/bench-dash-mariadb, port 13397), applies the schema as init-db does, writes
generated results into review_sentiment (313 rows in 12 hotels over 28 days like the demo, then --rows in 300 hotels
over three years, two languages and some without), recomputes the aggregates, and serves the dashboard through
`qwenspark dashboard` in a subprocess (its read-only account). Each endpoint is asked --requests times over loopback
per filter set: the default view (last 90 days with data), the whole range, one hotel, one language. The page's
first load (navigation start to the first charts drawn) is read from the page in headless chromium. Prints a table,
the query plans of the heaviest queries, and writes bench/results/dashboard_latency.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.config import QwenSparkConfig, load_config  # noqa: E402
from qwenspark.io import grants, migrate, mysql  # noqa: E402

DB_DIR, DB_PORT = ROOT / ".run" / "bench-dash-mariadb", 13397
ENDPOINTS = ("meta", "mix", "trend", "ranking", "heatmap", "reviews", "runs")
ASPECTS = [
    '[{"aspect":"room","sentiment":"positive"},{"aspect":"service","sentiment":"negative"}]',
    '[{"aspect":"location","sentiment":"positive"}]',
    '[{"aspect":"cleanliness","sentiment":"negative"},{"aspect":"food","sentiment":"neutral"},'
    '{"aspect":"noise","sentiment":"negative"}]',
    '[{"aspect":"price","sentiment":"positive"},{"aspect":"staff","sentiment":"positive"}]',
]


def generate(owner: QwenSparkConfig, rows: int, hotels: int, start: str, days: int) -> float:
    """Empty the results, write `rows` generated results and recompute the aggregates; returns the seconds taken."""
    t0 = time.perf_counter()
    aspects = ", ".join("'" + a + "'" for a in ASPECTS)
    with mysql.connect(owner.db, autocommit=True) as conn, conn.cursor() as cur:
        for table in ("review_sentiment", "job_runs"):  # the aggregates: recomputed below
            cur.execute(f"DELETE FROM {table}")
        step = 100_000
        for lo in range(1, rows + 1, step):
            hi = min(rows, lo + step - 1)
            cur.execute(
                "INSERT INTO review_sentiment (review_id, hotel_id, review_created_at, lang, input_key, sentiment, "
                "summary, aspects, truncated, error, model, prompt_version, tokens_in, tokens_out, latency_ms, "
                "analysed_at, run_id) "
                f"SELECT seq, CONCAT('H', LPAD((seq * 2654435761) % {hotels}, 4, '0')), "
                f"TIMESTAMP(%s) + INTERVAL ((seq * 40503) % ({days} * 86400)) SECOND, "
                "ELT(1 + seq % 5, 'zh', 'en', 'zh', 'en', NULL), REPEAT('k', 64), "
                "IF(seq % 97 = 0, NULL, ELT(1 + (seq * 7) % 10, 'positive', 'positive', 'positive', 'positive', "
                "'positive', 'negative', 'negative', 'neutral', 'mixed', 'positive')), CONCAT('summary ', seq), "
                f"ELT(1 + seq % 4, {aspects}), 0, IF(seq % 97 = 0, 'parse: no JSON', NULL), 'bench', 'v1', 100, 40, "
                f"10, UTC_TIMESTAMP(3), 'bench-run' FROM seq_{lo}_to_{hi}", (start,))
        cur.execute(
            "INSERT INTO job_runs (run_id, job, status, config_hash, model, prompt_version, started_at, finished_at, "
            "rows_selected, rows_analysed, rows_ok, rows_error, rows_changed, seconds_total) "
            "SELECT UUID(), 'batch', IF(seq % 10 = 0, 'failed', 'succeeded'), 'h', 'bench', 'v1', "
            "UTC_TIMESTAMP() - INTERVAL seq HOUR, UTC_TIMESTAMP() - INTERVAL seq HOUR + INTERVAL 5 MINUTE, "
            "1000, 1000, 990, 10, 1000, 300 FROM seq_1_to_200")
    with mysql.connect(owner.db) as conn:
        mysql.run_script(conn, mysql.sql_text("recompute_aggregates.sql"))
        conn.commit()
    return time.perf_counter() - t0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(sets: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """`qwenspark dashboard` in a subprocess on a free port; waits until it answers."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "qwenspark.cli", "-q", "dashboard", "--config",
                             str(ROOT / "conf" / "local.yaml"), *[f"--set={s}" for s in sets], "--port", str(port)],
                            cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/api/meta", timeout=2).raise_for_status()
            return proc, url
        except httpx.HTTPError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the dashboard did not start") from None
            time.sleep(0.2)


def latencies(url: str, requests: int, filters: dict[str, str]) -> dict[str, dict[str, float]]:
    """p50/p95 in ms of each endpoint with these filters (sequential requests over one keep-alive connection)."""
    out = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for name in ENDPOINTS:
            params = {} if name in ("meta", "runs") else filters
            for _ in range(3):
                client.get(f"/api/{name}", params=params).raise_for_status()
            times = []
            for _ in range(requests):
                t0 = time.perf_counter()
                client.get(f"/api/{name}", params=params).raise_for_status()
                times.append((time.perf_counter() - t0) * 1000)
            times.sort()
            out[name] = {"p50": round(statistics.median(times), 1),
                         "p95": round(times[min(len(times) - 1, int(0.95 * len(times)))], 1)}
    return out


def first_load(url: str, times: int = 5) -> list[float]:
    """The page's navigation start -> first charts drawn, ms, in headless chromium (a new page each time)."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        return []
    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for _ in range(times):
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(url)
            page.wait_for_function("() => window.qwenspark && window.qwenspark.polls >= 1", timeout=30_000)
            out.append(round(page.evaluate("() => window.qwenspark.firstLoadMs"), 1))
            page.close()
        browser.close()
    return out


def plans(owner: QwenSparkConfig, first: dt.date, last: dt.date) -> dict[str, list[str]]:
    """EXPLAIN of the heaviest queries over the whole range (as the owner: EXPLAIN on a view needs SHOW VIEW)."""
    # What the whole range reads (qwenspark.dashboard.queries.split): its whole months from the monthly rollups.
    months = (first.replace(day=1), last.replace(day=1))
    queries = {
        "ranking (group by hotel, whole months of the range)": (
            "SELECT hotel_id, SUM(reviews) FROM v_dash_monthly WHERE month BETWEEN %s AND %s GROUP BY hotel_id",
            months),
        "heatmap totals per aspect (whole months)": (
            "SELECT aspect, SUM(mentions), SUM(negative) FROM v_dash_aspects_monthly WHERE month BETWEEN %s AND %s "
            "GROUP BY aspect", months),
        "ranking, edge days (daily rows of one month)": (
            "SELECT hotel_id, SUM(reviews) FROM v_dash_daily WHERE day BETWEEN %s AND %s GROUP BY hotel_id",
            (last.replace(day=1), last)),
        "latest negative reviews": (
            "SELECT review_id FROM v_dash_reviews WHERE review_created_at >= %s AND review_created_at < %s AND "
            "sentiment IN ('negative', 'mixed') ORDER BY review_created_at DESC, review_id DESC LIMIT 20",
            (first, last)),
    }
    out = {}
    with mysql.connect(owner.db, autocommit=True) as conn, conn.cursor() as cur:
        for name, (sql, params) in queries.items():
            cur.execute("EXPLAIN " + sql, params)
            cols = [d[0] for d in cur.description or []]
            out[name] = [", ".join(f"{c}={v}" for c, v in zip(cols, row, strict=True)
                                   if c in ("table", "type", "key", "rows", "Extra")) for row in cur.fetchall()]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    env = {**os.environ, "MARIADB_DIR": str(DB_DIR), "MARIADB_PORT": str(DB_PORT)}
    # A new server folder every time: a server that has just deleted an earlier run's million rows is still purging
    # them in the background, which would be measured too.
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "stop"], check=False, env=env)
    shutil.rmtree(DB_DIR, ignore_errors=True)
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "start"], check=True, env=env)
    sets = [f"db.port={DB_PORT}", f"db.password_file={DB_DIR / 'qwenspark.password'}",
            f"db.admin_password_file={DB_DIR / 'qwenspark-admin.password'}",
            f"db.dashboard_password_file={DB_DIR / 'qwenspark-dashboard.password'}",
            "db.dashboard_password_env=QWENSPARK_BENCH_NO_SUCH_VAR", "engine.default_model=false"]
    cfg = load_config(ROOT / "conf" / "local.yaml", sets)
    migrate.migrate(cfg.db)
    grants.apply(cfg)
    owner = cfg.model_copy(update={"db": cfg.db.owner()})
    results: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "requests": args.requests}
    for label, rows, hotels, start, days in (("demo size", 313, 12, "2026-11-01", 28),
                                             (f"{args.rows:,} results", args.rows, 300, "2024-01-01", 3 * 365)):
        seconds = generate(owner, rows, hotels, start, days)
        first_day, last_day = mysql_bounds(owner)
        first, last = str(first_day), str(last_day)
        proc, url = serve(sets)
        try:
            hotel = httpx.get(url + "/api/ranking").json()["hotels"][0]["hotel_id"]
            scenarios = {"default (last 90 days)": {}, "whole range": {"from": first, "to": last},
                         "one hotel, whole range": {"from": first, "to": last, "hotel": hotel},
                         "language zh, whole range": {"from": first, "to": last, "lang": "zh"}}
            figures = {name: latencies(url, args.requests, f) for name, f in scenarios.items()}
            loads = first_load(url)
        finally:
            proc.terminate()
            proc.wait(10)
        results[label] = {"rows": rows, "hotels": hotels, "days": days, "generate_s": round(seconds, 1),
                          "latency_ms": figures, "first_load_ms": loads}
        print(f"\n## {label}: {rows:,} results, {hotels} hotels, {days} days (generated in {seconds:.0f} s)")
        print(f"{'filters':28} " + " ".join(f"{e:>15}" for e in ENDPOINTS))
        for name, per in figures.items():
            print(f"{name:28} " + " ".join(f"{per[e]['p50']:>6.1f}/{per[e]['p95']:<6.1f}  " for e in ENDPOINTS))
        print("  (p50/p95 ms per endpoint)")
        print(f"first page load, ms: {loads} (median {statistics.median(loads) if loads else '-'})")
        if rows == args.rows:
            results[label]["plans"] = plans(owner, first_day, last_day)
            for name, lines in results[label]["plans"].items():
                print(f"EXPLAIN {name}:")
                for line in lines:
                    print("   ", line)
    out = ROOT / "bench" / "results" / "dashboard_latency.json"
    out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"\nwritten {out.relative_to(ROOT)}")
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "stop"], check=False, env=env)
    return 0


def mysql_bounds(owner: QwenSparkConfig) -> tuple[Any, Any]:
    """The first and last day with results."""
    with mysql.connect(owner.db, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT MIN(day), MAX(day) FROM v_dash_daily")
        row = cur.fetchall()[0]
        return row[0], row[1]


if __name__ == "__main__":
    sys.exit(main())
