"""Run under spark-submit by test_spark_submit_conf.py: the job's session over spark-submit's settings, as JSON."""

from __future__ import annotations

import json
import sys

from qwenspark.config import load_config
from qwenspark.io.jdbc import jdbc_options
from qwenspark.session import spark_session


def main() -> None:
    cfg = load_config(sys.argv[1], sys.argv[2:])
    spark = spark_session(cfg)
    try:
        conf = dict(spark.sparkContext.getConf().getAll())
        # The JDBC driver must load from the jar spark-submit was given (at a non-default path).
        rows = spark.read.format("jdbc").options(**jdbc_options(cfg)).option("dbtable", "hotel_reviews").load().count()
        keys = ("spark.jars", "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
                "spark.sql.session.timeZone", "spark.python.worker.reuse", "spark.driver.memory")
        print(json.dumps({"conf": {k: conf.get(k) for k in keys}, "rows": rows}), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
