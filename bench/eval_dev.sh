#!/usr/bin/env bash
# Quality and speed of the default model on real labelled dev reviews (100 zh + 100 en by default).
#   bench/eval_dev.sh [N] [extra qwenspark eval args, e.g. --set engine.batch_size=64]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200}; shift || true
export PYSPARK_PYTHON=$PWD/.venv/bin/python SPARK_LOCAL_IP=127.0.0.1
.venv/bin/qwenspark -q eval --input ../shared/data/hotel_reviews/reviews_dev.csv --limit "$N" --seed 1 --json "$@"
