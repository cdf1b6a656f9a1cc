"""The SparkSession the jobs use, and driver-side checks of the Spark settings they rely on."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from qwenspark import resources
from qwenspark.config import QwenSparkConfig
from qwenspark.errors import ConfigError

log = logging.getLogger(__name__)

# Settings the job needs; spark-submit --conf or spark-defaults.conf may set them too.
BASE_CONF: dict[str, str] = {
    # The engine cache lives in the Python worker: without reuse every task would reload the model.
    "spark.python.worker.reuse": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


# Java options the JVMs need; appended to what the user passed, never replacing it.
REQUIRED_JAVA_OPTIONS = "-Duser.timezone=UTC"
JAVA_OPTION_KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
# Settings whose value must be this one: another value would break the job, so the job refuses to start.
REQUIRED_VALUES = {"spark.sql.session.timeZone": "UTC", "spark.python.worker.reuse": "true"}


def submitted_conf() -> dict[str, str]:
    """Spark settings already made by spark-submit (--conf, --jars, --packages, --properties-file), if any."""
    from pyspark import SparkConf, SparkContext

    # spark-submit starts the JVM first and hands Python its gateway; a plain `python` run has none yet (our
    # settings then reach the JVM at its launch, so nothing can have been set before them).
    if not os.environ.get("PYSPARK_GATEWAY_PORT") and SparkContext._gateway is None:
        return {}
    # Connect to spark-submit's JVM (it exists already), so that SparkConf() reads its system properties.
    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def merged_conf(cfg: QwenSparkConfig, given: Mapping[str, str]) -> dict[str, str]:
    """The settings to add to `given` (what spark-submit set): only absent keys, plus appended jar and options.

    Raises ConfigError naming the key when a given value would break the job.
    """
    for key, value in REQUIRED_VALUES.items():
        if key in given and str(given[key]).strip().lower() != value.lower():
            raise ConfigError(f"{key}={given[key]} (from spark-submit): the job needs {value}; remove the setting")
    wanted = {**BASE_CONF, **cfg.spark.conf}
    out = {k: v for k, v in wanted.items() if k not in given and k not in JAVA_OPTION_KEYS}
    for key in JAVA_OPTION_KEYS:
        have = str(given.get(key, "")).strip()
        zone = re.search(r"-Duser\.timezone=(\S+)", have)
        if zone and zone.group(1) != "UTC":
            raise ConfigError(f"{key} sets {zone.group(0)}: the job needs -Duser.timezone=UTC (JDBC DATETIMEs)")
        extra = str(cfg.spark.conf.get(key, "")).strip()
        if not zone:
            out[key] = " ".join(p for p in (have, extra if extra not in have else "", REQUIRED_JAVA_OPTIONS) if p)
        elif extra and extra not in have:
            out[key] = f"{have} {extra}"
    jars = [j for j in str(given.get("spark.jars", "")).split(",") if j.strip()]
    if not any(re.search(r"mariadb|mysql", Path(j).name, re.I) for j in jars):
        jars.append(str(cfg.db.jdbc_jar))
        out["spark.jars"] = ",".join(jars)
    return out


# Attempts per task in local mode, where spark.task.maxFailures does not apply: `local[N]` never retries, so one
# lost Python worker (the model's process killed by the OOM killer, a segfault in a native library) would fail
# the whole run. local[N, R] gives each task R attempts, as a cluster's maxFailures does.
LOCAL_TASK_ATTEMPTS = 4
_LOCAL = re.compile(r"^local(?:\[(\*|\d+)\])?$")


def with_local_retries(master: str, attempts: int = LOCAL_TASK_ATTEMPTS) -> str:
    """local, local[N] or local[*] -> local[N,attempts]; any other master (and local[N,R]) as given."""
    m = _LOCAL.match(master.strip())
    if not m:
        return master
    return f"local[{m.group(1) or 1},{attempts}]"


def spark_session(cfg: QwenSparkConfig) -> SparkSession:
    """getOrCreate: what spark-submit set wins; the job fills absent keys and appends its jar and Java options."""
    # Without this, local workers start the system python and fail on `import pyarrow`.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    given = submitted_conf()
    builder = SparkSession.builder.appName(cfg.spark.app_name)
    master = given.get("spark.master") or cfg.spark.master
    if master:
        retried = with_local_retries(master, int(given.get("spark.task.maxFailures") or LOCAL_TASK_ATTEMPTS))
        if retried != master:
            log.info("Spark master %s -> %s: each task gets %s attempts, as on a cluster", master, retried,
                     retried.rsplit(",", 1)[1].rstrip("]"))
        if retried != given.get("spark.master"):
            builder = builder.master(retried)
    added = merged_conf(cfg, given)
    for key, value in added.items():
        builder = builder.config(key, value)
    kept = sorted(k for k in given if k in {**BASE_CONF, **cfg.spark.conf} or k in ("spark.jars", "spark.master"))
    log.info("Spark settings: kept from spark-submit %s; filled or appended %s", kept, sorted(added))
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
