"""A separate Spark driver for test_gpu_cluster.py: run_batch on a standalone cluster, one JSON line out.

Whole run: JDBC read -> clean -> skip current -> mapInPandas (the inference stage, with its ResourceProfile)
-> staging write -> commit, with the echo test engine (tests/support/echo_engine.py) recording its calls.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", required=True, help="spark://host:port of the standalone Master")
    parser.add_argument("--executors", type=int, default=4)
    parser.add_argument("--executor-cores", type=int, default=2)
    parser.add_argument("--records", required=True, help="folder for the echo engine's records")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config overrides")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark settings k=v")
    args = parser.parse_args()

    import logging
    import sys

    from pyspark.sql import SparkSession

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from qwenspark.config import load_config
    from qwenspark.pipeline import run_batch

    cfg = load_config(
        ROOT / "conf" / "local.yaml",
        [
            "engine.kind=custom",
            "engine.factory=tests.support.echo_engine:build",
            "engine.model=echo",
            "engine.default_model=false",
            "engine.device=cuda",  # the driver check must find the GPU settings below
            "job.slots=null",  # from the cluster (local.yaml says 1, for local mode)
            f"engine.engine_kwargs.record_dir={args.records}",
            *args.overrides,
        ],
    )
    conf = {
        "spark.jars": str(cfg.db.jdbc_jar),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.extraJavaOptions": f"-Duser.timezone=UTC {FAST_JVM}",
        "spark.executor.extraJavaOptions": f"-Duser.timezone=UTC {FAST_JVM}",
        "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true",
        # N executors of C cores, each holding one of the worker's (fake) GPUs. spark.task.resource.gpu.amount
        # stays unset: the read and write stages run C tasks per executor and hold no GPU; the inference stage
        # asks for one GPU per task through its ResourceProfile.
        "spark.executor.cores": str(args.executor_cores),
        "spark.cores.max": str(args.executors * args.executor_cores),
        "spark.executor.memory": "1g",
        "spark.executor.resource.gpu.amount": "1",
        # Start scheduling only once every executor is up: otherwise the first ones could take every task.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        **dict(item.split("=", 1) for item in args.conf),
    }
    builder = SparkSession.builder.master(args.master).appName("qwenspark-gpu-cluster-test")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        started = time.perf_counter()
        summary = run_batch(spark, cfg)
        print(
            json.dumps(
                {
                    "status": summary.status,
                    "rows_analysed": summary.rows_analysed,
                    "rows_ok": summary.rows_ok,
                    "slots": summary.slots,
                    "partitions": summary.partitions,
                    "rows_per_engine": summary.rows_per_engine,
                    "seconds": round(time.perf_counter() - started, 2),
                    "seconds_analyse": round(summary.seconds_analyse, 2),
                }
            ),
            flush=True,
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
