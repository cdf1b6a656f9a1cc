"""The SparkSession the jobs use, and driver-side checks of the Spark settings they rely on."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from qwenspark import resources
from qwenspark.config import QwenSparkConfig
from qwenspark.errors import ConfigError

# Settings the job needs; spark-submit --conf or spark-defaults.conf may set them too.
BASE_CONF: dict[str, str] = {
    # The engine cache lives in the Python worker: without reuse every task would reload the model.
    "spark.python.worker.reuse": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def spark_session(cfg: QwenSparkConfig) -> SparkSession:
    """getOrCreate with the JDBC jar and BASE_CONF; under spark-submit the existing session wins."""
    # Without this, local workers start the system python and fail on `import pyarrow`.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(cfg.spark.app_name)
    if cfg.spark.master:
        builder = builder.master(cfg.spark.master)
    conf = {**BASE_CONF, "spark.jars": str(cfg.db.jdbc_jar), **cfg.spark.conf}
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def check_spark_conf(spark: SparkSession, cfg: QwenSparkConfig) -> None:
    """Refuse to start with settings that would silently reload the model per task or miss the driver."""
    conf = spark.sparkContext.getConf()
    jars = " ".join(conf.get(k, "") for k in ("spark.jars", "spark.driver.extraClassPath"))
    if "mariadb" not in jars and "mysql" not in jars:
        raise ConfigError(
            f"no JDBC driver jar in spark.jars: pass --jars {cfg.db.jdbc_jar} to spark-submit (db.jdbc_jar)"
        )
    # Also refuses spark.python.worker.reuse=false (the model would reload per task).
    resources.check_gpu_conf(dict(conf.getAll()), cfg)
