"""Streaming job: analyse new hotel reviews as they arrive, exactly once, in bounded micro-batches.

Local (embedded MariaDB and model; `make stream` runs exactly this):
    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit \
        --jars /usr/share/java/mariadb-java-client.jar --conf spark.python.worker.reuse=true \
        jobs/hotel_sentiment_stream.py --config conf/local.yaml

Sources (stream.source): `mysql` reads new rows of hotel_reviews by review_id; `files` reads a landing folder.
Stop it with Ctrl-C or SIGTERM; a restart on the same stream.checkpoint_location continues where it was,
and a micro-batch whose results were already committed is skipped (ledger: the stream_commits table).
On a cluster it is submitted like jobs/hotel_sentiment.py (README.md, "Deploying to a cluster"); keep
stream.checkpoint_location on storage every driver attempt can reach (HDFS, S3, a shared volume).
"""

import sys

from qwenspark.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
