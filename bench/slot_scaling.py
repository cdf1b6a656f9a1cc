"""Slot scaling and the inference tail on a real standalone cluster with fake GPUs (issue 8, "Measure and report").

    .venv/bin/python bench/slot_scaling.py [--rows 960] [--batch-size 8] [--seconds-per-token 0.003] [--repeats 2]

Starts a throwaway MariaDB (.run/bench-slots/mariadb, a free port) and a standalone Master + Worker offering
4 fake GPUs (tests/support/standalone.py), loads --rows reviews into hotel_reviews, then runs the whole batch job
(JDBC read -> clean -> analyse -> staging write -> commit) through tests/spark/gpu_cluster_driver.py with the
deterministic echo engine (tests/support/echo_engine.py: a batch sleeps seconds_per_token x its longest answer,
answer lengths varied per review in [min_tokens, max_tokens], as on a GPU). Every run starts from empty result
tables, so each one analyses and commits every review.

Runs: 1 and 2 executors of one fake GPU each (= slots) at the default partitions_per_slot (2), then 4 executors
with 1, 2 and 4 partitions per slot, each --repeats times (order rotated per round; medians reported). Every
figure comes from outside the code under test: rows and rows per engine from the echo engine's own records, task
times from Spark's event log (the inference stage = the stage the echo engine ran in, read from its records).

  rows/s          rows / inference window (first inference task launch -> last inference task end)
  efficiency      rows/s at 4 slots / (4 x rows/s at 1 slot) (also for engine rows/s and job wall time)
  engine rows/s   each engine's rows / (its last call end - its first call start), summed over engines
                  (leaves out Python worker start and engine load, which share this host's cores)
  busy            engine time (sum of the echo calls) / (slots x inference window)
  tail_tasks      last inference task end - median inference task end (over all the stage's tasks; with
                  several partitions per slot the median task ends in an earlier wave, so this grows with
                  partitions_per_slot even when every engine finishes together)
  tail_engines    last engine's end - median engine's end (an engine's end = its last inference task end):
                  how long engines sit idle while the last one finishes
  wall            the driver's run_batch (read ... commit); the driver process (Spark start and stop too)

Prints a table and writes bench/results/cpu_slot_scaling.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwenspark.config import QwenSparkConfig, load_config  # noqa: E402
from qwenspark.io import grants, migrate, mysql  # noqa: E402
from tests.support.echo_engine import max_overlap, read_records  # noqa: E402
from tests.support.standalone import SPARK_HOME, free_port, stop_group, tail  # noqa: E402
from tests.support.standalone import standalone_cluster as start_standalone  # noqa: E402

DRIVER = ROOT / "tests" / "spark" / "gpu_cluster_driver.py"
WORK = ROOT / ".run" / "bench-slots"
MAX_SLOTS = 4

TEXTS = [
    "Room {i} was spotless and the staff were kind; the bed was comfortable and checkout quick.",
    "Breakfast was cold and the lift broken ({i}); reception shrugged.",
    "房间{i}很干净，服务员态度很好，早餐种类也多。",
    "位置不错，但是隔音太差，晚上很吵。第{i}次住，下次不会再来了。",
    "Great location near the station (stay {i}), tiny room, noisy air conditioning, friendly staff.",
    "性价比一般，房间{i}有点旧，但前台很热情。",
]


def reviews_csv(path: Path, n: int) -> Path:
    start = datetime(2026, 11, 1)
    lines = ["review_id,hotel_id,created_at,lang,rating,text"]
    for i in range(1, n + 1):
        text = TEXTS[i % len(TEXTS)].format(i=i)
        lang = "zh" if any("\u4e00" <= c <= "\u9fff" for c in text) else "en"
        created = (start + timedelta(hours=i % 500)).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f'{i},H{i % 7},{created},{lang},{1 + i % 5},"{text}"')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def clear_results(cfg: QwenSparkConfig) -> None:
    """Empty every result table, so the next run analyses and commits every review."""
    with mysql.connect(cfg.db, autocommit=True) as conn, conn.cursor() as cur:
        for table in grants.RESULT_TABLES:  # not qwenspark_schema: the runs check the schema version
            cur.execute(f"DELETE FROM `{table}`")


def run_driver(url: str, name: str, db: dict[str, str], args: argparse.Namespace, *, executors: int,
               partitions_per_slot: int) -> dict[str, Any]:
    """One whole batch run on `executors` executors; the driver's JSON line plus where its records went."""
    folder = WORK / "runs" / name
    records, events = folder / "records", folder / "events"
    events.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
    overrides = [
        f"db.port={db['port']}", f"db.password_file={db['password_file']}",
        "db.password_env=QWENSPARK_BENCH_NO_SUCH_VAR",
        f"engine.batch_size={args.batch_size}",
        f"engine.engine_kwargs.seconds_per_token={args.seconds_per_token}",
        f"engine.engine_kwargs.min_tokens={args.min_tokens}",
        f"engine.engine_kwargs.max_tokens={args.max_tokens}",
        f"job.partitions_per_slot={partitions_per_slot}",
    ]
    spark_conf = ["spark.eventLog.enabled=true", f"spark.eventLog.dir={events.as_uri()}",
                  "spark.eventLog.compress=false", "spark.eventLog.rolling.enabled=false"]
    cmd = [sys.executable, str(DRIVER), "--master", url, "--executors", str(executors),
           "--executor-cores", str(args.executor_cores), "--records", str(records),
           *[a for o in overrides for a in ("--set", o)], *[a for c in spark_conf for a in ("--conf", c)]]
    log = folder / "driver.log"
    t0 = time.perf_counter()
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            stdout, _ = proc.communicate(timeout=args.run_timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s=5)
            stdout = b""
    process_s = time.perf_counter() - t0
    lines = [line for line in stdout.decode(errors="replace").splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"run {name}: driver exit {proc.returncode}:\n{tail(log, 60)}")
    return {**json.loads(lines[-1]), "process_s": process_s, "records": records, "events": events}


def event_log_tasks(folder: Path, stages: set[int]) -> list[dict[str, Any]]:
    """Successful task attempts of `stages` from the application's event log: launch/end (s), partition, executor."""
    logs = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    if len(logs) != 1:
        raise SystemExit(f"expected one event log in {folder}, found {[p.name for p in logs]}")
    tasks = []
    for line in logs[0].read_text(errors="replace").splitlines():
        event = json.loads(line)
        if event.get("Event") != "SparkListenerTaskEnd" or event.get("Stage ID") not in stages:
            continue
        if event.get("Task End Reason", {}).get("Reason") != "Success":
            continue
        info = event["Task Info"]
        tasks.append({"partition": info["Partition ID"], "attempt": info["Attempt"], "executor": info["Executor ID"],
                      "launch": info["Launch Time"] / 1000, "end": info["Finish Time"] / 1000})
    return tasks


def measure(result: dict[str, Any], executors: int, partitions_per_slot: int) -> dict[str, Any]:
    records = read_records(result["records"])
    loads = [r for r in records if r["event"] == "load"]
    calls = [r for r in records if r["event"] == "call"]
    device_of = {r["pid"]: str(r["devices"]) for r in loads}
    rows_per_engine: Counter[str] = Counter()
    engine_s: defaultdict[str, float] = defaultdict(float)
    spans: dict[str, tuple[float, float]] = {}
    for c in calls:
        key = f"gpu{device_of.get(c['pid'], '?')}/pid{c['pid']}"
        rows_per_engine[key] += int(c["rows"])
        engine_s[key] += float(c["end"]) - float(c["start"])
        a, b = spans.get(key, (float(c["start"]), float(c["end"])))
        spans[key] = (min(a, float(c["start"])), max(b, float(c["end"])))
    stages = {int(c["stage"]) for c in calls if c.get("stage") is not None}
    tasks = event_log_tasks(result["events"], stages)
    if not tasks:
        raise SystemExit(f"no inference task in the event log {result['events']} (stages {stages})")
    first = min(t["launch"] for t in tasks)
    ends = sorted(t["end"] for t in tasks)
    window = ends[-1] - first
    by_executor: defaultdict[str, list[float]] = defaultdict(list)
    for t in tasks:
        by_executor[t["executor"]].append(t["end"])
    engine_ends = sorted(max(v) for v in by_executor.values())
    idle_tail = sum(ends[-1] - e for e in engine_ends)
    rows = sum(rows_per_engine.values())
    # The same tail from the echo records alone (an engine's task ends with its last call), as a cross-check.
    call_end_by_task: dict[tuple[int, int], float] = {}
    for c in calls:
        task = (int(c["partition"]), int(c["attempt"]))
        call_end_by_task[task] = max(call_end_by_task.get(task, 0.0), float(c["end"]))
    echo_ends = sorted(call_end_by_task.values())
    return {
        "executors": executors,
        "slots": result["slots"],
        "partitions_per_slot": partitions_per_slot,
        "partitions": result["partitions"],
        "status": result["status"],
        "rows_committed": result["rows_ok"],
        "rows_engine": rows,
        "engines": len(rows_per_engine),
        "rows_per_engine": dict(sorted(rows_per_engine.items())),
        "engine_calls": len(calls),
        "inference_tasks": len(tasks),
        "max_concurrent_calls": max_overlap([(float(c["start"]), float(c["end"])) for c in calls]),
        "inference_window_s": round(window, 3),
        "rows_per_s": round(rows / window, 2),
        "engine_busy": round(sum(engine_s.values()) / (result["slots"] * window), 3),
        # Each engine from its first call to its last (Python worker start and engine load left out), summed.
        "engine_rows_per_s": round(sum(rows_per_engine[k] / (b - a) for k, (a, b) in spans.items()), 2),
        "engine_start_after_first_launch_s": sorted(round(a - first, 3) for a, _ in spans.values()),
        "tail_tasks_s": round(ends[-1] - statistics.median(ends), 3),
        "tail_engines_s": round(engine_ends[-1] - statistics.median(engine_ends), 3),
        "engine_ends_after_first_launch_s": [round(e - first, 3) for e in engine_ends],
        "idle_tail_engine_s": round(idle_tail, 3),
        "tail_tasks_echo_s": round(echo_ends[-1] - statistics.median(echo_ends), 3),
        "wall_run_batch_s": result["seconds"],
        "wall_analyse_s": result["seconds_analyse"],
        "wall_process_s": round(result["process_s"], 2),
    }


def print_table(runs: list[dict[str, Any]]) -> None:
    head = (f"{'slots':>5} {'pps':>3} {'parts':>5} {'rows':>5} {'rows per engine':<19} {'infer s':>7} {'rows/s':>6}"
            f" {'eng r/s':>7} {'busy':>4} {'start':>11} {'tail tasks':>10} {'tail eng':>8} {'wall job':>8}"
            f" {'wall proc':>9}")
    print(head)
    print("-" * len(head))
    for r in runs:
        per = "/".join(str(v) for v in r["rows_per_engine"].values())
        starts = r["engine_start_after_first_launch_s"]
        start = f"{starts[0]:.0f}-{starts[-1]:.0f}"
        print(f"{r['slots']:>5} {r['partitions_per_slot']:>3} {r['partitions']:>5} {r['rows_engine']:>5} {per:<19}"
              f" {r['inference_window_s']:>7.1f} {r['rows_per_s']:>6.1f} {r['engine_rows_per_s']:>7.1f}"
              f" {r['engine_busy']:>4.0%} {start:>11} {r['tail_tasks_s']:>10.2f} {r['tail_engines_s']:>8.2f}"
              f" {r['wall_run_batch_s']:>8.1f} {r['wall_process_s']:>9.1f}")
    print("  rows/s: over the inference stage (first task launch -> last end); eng r/s: each engine from its first"
          " to its last call, summed;\n  start: s from the first inference task launch to each engine's first call"
          " (Python worker start + imports + engine load); tail: last end - median end, over tasks / engines")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=960)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seconds-per-token", type=float, default=0.003)
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--executor-cores", type=int, default=2)
    parser.add_argument("--default-pps", type=int, default=2, help="partitions_per_slot of the scaling runs")
    parser.add_argument("--pps", type=int, nargs="+", default=[1, 2, 4], help="partitions_per_slot at 4 slots")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each partitions_per_slot at 4 slots")
    parser.add_argument("--run-timeout-s", type=float, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu_slot_scaling.json")
    args = parser.parse_args()

    # Spark's Python workers import the echo engine (tests.support.echo_engine): the Worker daemon, and so its
    # executors, must have the repository root on PYTHONPATH.
    if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    db_dir, db_port = WORK / "mariadb", free_port()
    db_env = {**os.environ, "MARIADB_DIR": str(db_dir), "MARIADB_PORT": str(db_port)}
    subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "start"], check=True, env=db_env)
    db = {"port": str(db_port), "password_file": str(db_dir / "qwenspark.password")}
    started = time.perf_counter()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    try:
        cfg = load_config(ROOT / "conf" / "local.yaml",
                          [f"db.port={db_port}", f"db.password_file={db['password_file']}",
                           "db.password_env=QWENSPARK_BENCH_NO_SUCH_VAR", "engine.default_model=false",
                           f"db.admin_password_file={db_dir / 'qwenspark-admin.password'}"])
        migrate.migrate(cfg.db)
        grants.apply(cfg)
        clear_results(cfg)
        with mysql.connect(cfg.db.owner(), autocommit=True) as conn, conn.cursor() as cur:  # the job only reads it
            cur.execute("DELETE FROM hotel_reviews")
        mysql.load_reviews_csv(cfg.db.owner(), reviews_csv(WORK / "reviews.csv", args.rows))

        # 1 and 2 slots once; at 4 slots every partitions_per_slot --repeats times, the order rotated each round
        # so that no setting always runs first (this host's load drifts).
        pps_all = sorted({args.default_pps, *args.pps})
        plan = [(n, args.default_pps, 1) for n in (1, 2)]
        plan += [(MAX_SLOTS, p, k + 1) for k in range(args.repeats) for p in pps_all[k % len(pps_all):]
                 + pps_all[:k % len(pps_all)]]
        with start_standalone(WORK / "cluster", gpus=MAX_SLOTS, cores=MAX_SLOTS * args.executor_cores) as url:
            for executors, pps, round_ in plan:
                name = f"slots{executors}-pps{pps}-r{round_}"
                clear_results(cfg)
                print(f"[slot_scaling] {name} ...", file=sys.stderr, flush=True)
                result = run_driver(url, name, db, args, executors=executors, partitions_per_slot=pps)
                run = {"round": round_, **measure(result, executors, pps)}
                if run["rows_engine"] != args.rows or run["rows_committed"] != args.rows:
                    raise SystemExit(f"{name}: {run['rows_engine']} rows analysed, {run['rows_committed']} committed")
                runs.append(run)
                print(f"[slot_scaling] {name}: {run['rows_per_s']} rows/s, wall {run['wall_run_batch_s']} s",
                      file=sys.stderr, flush=True)
    finally:
        subprocess.run([str(ROOT / "scripts" / "mariadb.sh"), "stop"], check=False, env=db_env)

    def median_of(slots: int, pps: int, key: str) -> float:
        return float(statistics.median(r[key] for r in runs if r["slots"] == slots and r["partitions_per_slot"] == pps))

    keys = ("rows_per_s", "engine_rows_per_s", "wall_run_batch_s")
    one = {k: median_of(1, args.default_pps, k) for k in keys}
    four = {k: median_of(MAX_SLOTS, args.default_pps, k) for k in keys}
    efficiency = four["rows_per_s"] / (MAX_SLOTS * one["rows_per_s"])
    efficiency_wall = one["wall_run_batch_s"] / (MAX_SLOTS * four["wall_run_batch_s"])
    efficiency_engines = four["engine_rows_per_s"] / (MAX_SLOTS * one["engine_rows_per_s"])
    tail_keys = ("tail_tasks_s", "tail_engines_s", "idle_tail_engine_s", "inference_window_s", "rows_per_s",
                 "engine_rows_per_s", "engine_busy", "wall_run_batch_s", "wall_process_s")
    tails = {
        p: {"partitions": MAX_SLOTS * p, "runs": sum(1 for r in runs if r["slots"] == MAX_SLOTS
                                                     and r["partitions_per_slot"] == p),
            **{k: round(median_of(MAX_SLOTS, p, k), 3) for k in tail_keys}}
        for p in sorted({r["partitions_per_slot"] for r in runs if r["slots"] == MAX_SLOTS})
    }
    print(f"\nSlot scaling on a standalone cluster with fake GPUs (echo engine, {args.rows} reviews, batch"
          f" {args.batch_size}, answers {args.min_tokens}-{args.max_tokens} tokens x {args.seconds_per_token} s/token,"
          f" {os.cpu_count()} CPU cores, load {load_before[0]:.1f} at start); whole job: read -> analyse -> stage"
          " -> commit\n")
    print_table(runs)
    print(f"\nscaling efficiency, 4 slots / (4 x 1 slot) (4 slots: median of its runs): inference rows/s"
          f" {efficiency:.2f}, engine rows/s {efficiency_engines:.2f}, job wall time {efficiency_wall:.2f}")
    print(f"\nat {MAX_SLOTS} slots, medians over {args.repeats} run(s) each:")
    print(f"{'pps':>3} {'parts':>5} {'tail tasks s':>12} {'tail engines s':>14} {'infer s':>7} {'rows/s':>6}"
          f" {'eng r/s':>7} {'wall job s':>10} {'wall proc s':>11}")
    for p, t in tails.items():
        print(f"{p:>3} {t['partitions']:>5} {t['tail_tasks_s']:>12.2f} {t['tail_engines_s']:>14.2f}"
              f" {t['inference_window_s']:>7.1f} {t['rows_per_s']:>6.1f} {t['engine_rows_per_s']:>7.1f}"
              f" {t['wall_run_batch_s']:>10.1f} {t['wall_process_s']:>11.1f}")
    result = {
        "bench": "bench/slot_scaling.py",
        "measured_at": datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu_cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": [round(x, 2) for x in load_before],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                    "note": "2 cores shared with other engineers' processes: timings carry their noise"},
        "setup": {"cluster": f"standalone Master + 1 Worker, {MAX_SLOTS} fake GPUs,"
                             f" {MAX_SLOTS * args.executor_cores} cores; executors of {args.executor_cores} cores"
                             " and 1 GPU; inference stage asks 1 GPU per task (ResourceProfile)",
                  "engine": "tests/support/echo_engine.py (sleeps seconds_per_token x the batch's longest answer)",
                  "rows": args.rows, "batch_size": args.batch_size, "seconds_per_token": args.seconds_per_token,
                  "min_tokens": args.min_tokens, "max_tokens": args.max_tokens,
                  "job": "run_batch: JDBC read -> clean -> skip current -> mapInPandas -> staging write -> commit,"
                         " result tables emptied before each run"},
        "definitions": {
            "rows_per_s": "echo-recorded rows / (last inference task end - first inference task launch), event log",
            "scaling_efficiency": "rows_per_s at 4 slots (median of its runs) / (4 x rows_per_s at 1 slot)",
            "engine_busy": "sum of echo call durations / (slots x inference window)",
            "engine_rows_per_s": "sum over engines of rows / (its last call end - its first call start)",
            "engine_start_after_first_launch_s": "first inference task launch -> each engine's first call",
            "tail_tasks_s": "last inference task end - median inference task end",
            "tail_engines_s": "last engine end - median engine end (engine end: its executor's last inference task)",
            "idle_tail_engine_s": "sum over engines of (last task end - that engine's last task end)",
            "wall_run_batch_s": "run_batch in the driver: read ... commit",
            "wall_process_s": "the driver process: Spark start, run_batch, Spark stop",
        },
        "runs": runs,
        "scaling_efficiency": round(efficiency, 3),
        "scaling_efficiency_engine_rows_per_s": round(efficiency_engines, 3),
        "scaling_efficiency_job_wall": round(efficiency_wall, 3),
        "at_4_slots_medians": {str(p): t for p, t in tails.items()},
        "bench_seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"\nwritten {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
