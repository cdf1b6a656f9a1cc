"""A separate Spark driver for test_gpu_cluster.py: analyse() on a standalone cluster, one JSON line out."""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TEXTS = [
    "Room {i} was spotless and the staff were kind.",
    "Breakfast was cold, the lift broken, and nobody at reception cared (stay {i}).",
    "房间{i}很干净，服务员态度很好，早餐一般。",
    "位置不错，但是隔音太差，晚上很吵。第{i}次住。",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--master", required=True, help="spark://host:port of the standalone Master")
    parser.add_argument("--model", required=True, help="the tiny model folder")
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from qwenspark.clean import clean
    from qwenspark.config import load_config
    from qwenspark.pipeline import analyse, new_metrics
    from qwenspark.schemas import INPUT_SCHEMA
    from qwenspark.session import BASE_CONF, check_spark_conf

    cfg = load_config(
        ROOT / "conf" / "local.yaml",
        [
            f"engine.model={args.model}",
            "engine.default_model=false",
            "engine.device=cuda",  # the driver check must find the GPU settings below
            f"engine.batch_size={args.batch_size}",
            f"engine.max_tokens={args.max_tokens}",
            "engine.env.VLLM_ENABLE_V1_MULTIPROCESSING=0",
            "engine.env.VLLM_CPU_KVCACHE_SPACE=1",
            f"job.repartition={args.partitions}",
        ],
    )
    fast_jvm = "-Duser.timezone=UTC -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    conf = {
        **BASE_CONF,
        "spark.jars": str(cfg.db.jdbc_jar),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": fast_jvm,
        "spark.executor.extraJavaOptions": fast_jvm,
        # Two executors of one core each, each holding one of the worker's two (fake) GPUs.
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executor.memory": "2g",
        "spark.executor.resource.gpu.amount": "1",
        "spark.task.resource.gpu.amount": "1",
        "spark.python.worker.reuse": "true",
        # Start scheduling only once both executors are up: otherwise the first one could take every task.
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }
    builder = SparkSession.builder.master(args.master).appName("qwenspark-gpu-cluster-test")
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    try:
        check_spark_conf(spark, cfg)
        start = datetime(2026, 11, 1)
        data = [
            (i, f"H{i % 3}", start + timedelta(hours=i), "zh" if i % 4 >= 2 else "en", 1 + i % 5,
             TEXTS[i % 4].format(i=i))
            for i in range(args.rows)
        ]
        metrics = new_metrics(spark)
        started = time.perf_counter()
        result = analyse(clean(spark.createDataFrame(data, INPUT_SCHEMA), cfg), cfg, metrics)
        # spark_partition_id() after mapInPandas is the index of the task that produced the row.
        rows = result.select("review_id", "error", F.spark_partition_id().alias("task")).collect()
        seconds = time.perf_counter() - started
        print(
            json.dumps(
                {
                    "rows": len(rows),
                    "review_ids": sorted(r.review_id for r in rows),
                    "errors": sum(r.error is not None for r in rows),
                    "tasks": sorted({r.task for r in rows}),
                    "engine_loads": dict(metrics.engine_loads.value),
                    "gpu_bindings": dict(metrics.gpu_bindings.value),
                    "batch_sizes": dict(metrics.batch_sizes.value),
                    "metric_rows": metrics.rows.value,
                    "seconds": round(seconds, 1),
                }
            ),
            flush=True,
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
