"""Batch job: analyse new or changed hotel reviews in MySQL and upsert the results.

Local (embedded MariaDB and model; `make demo` runs exactly this):
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit \
        --jars /usr/share/java/mariadb-java-client.jar --conf spark.python.worker.reuse=true \
        jobs/hotel_sentiment.py --config conf/local.yaml

Cluster (any MySQL-protocol server; password in the environment, never on the command line):
    export QWENSPARK_DB_PASSWORD=...            # or db.password_file in the YAML
    spark-submit --master yarn --deploy-mode client \
        --jars /path/to/mariadb-java-client.jar \
        --properties-file conf/spark-defaults-gpu.conf \
        jobs/hotel_sentiment.py --config conf/cluster-gpu.yaml --set source.created_from=2026-11-29

Shipping the Python environment, the config, the JDBC jar and the password to YARN, Kubernetes or a
standalone cluster (cluster deploy mode): README.md, "Deploying to a cluster". Without --config the job
reads $QWENSPARK_CONFIG, else conf/local.yaml in the current folder; `qwenspark config-template cluster-gpu`
prints the GPU template.
"""

import sys

from qwenspark.cli import main

if __name__ == "__main__":
    sys.exit(main(["batch", *sys.argv[1:]]))
