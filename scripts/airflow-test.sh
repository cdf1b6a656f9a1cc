#!/usr/bin/env bash
# Run the nightly DAG once, locally, through real Airflow: `airflow dags test` (no scheduler, no webserver,
# SQLite metadata DB), its one task spark-submitting jobs/hotel_sentiment.py.
#
#   scripts/airflow-test.sh LOGICAL_DATE          e.g. scripts/airflow-test.sh 2026-11-03
#
# `airflow dags test DAG D` processes the interval of a manual run at D: the day that ENDS at D, [D-1, D).
# (The scheduled/backfill run with logical date D covers [D, D+1).)
#
# Idempotent: creates .venv-airflow once (Airflow's Spark provider pulls pyspark-client, which overwrites
# the real pyspark: it must never go into .venv), migrates the SQLite DB only when it is missing.
#
# Environment (all optional):
#   QWENSPARK_CONFIG       job config (default conf/local.yaml); its db.* keys say which database
#   QWENSPARK_DB_PASSWORD  the password, if the config's db.password_file is not used; inherited by
#                          spark-submit from this environment, never passed as an argument
#   QWENSPARK_PYTHON       python of the Spark venv (default .venv/bin/python)
#   AIRFLOW_HOME           default .run/airflow (airflow.cfg, airflow.db, logs)
#   QWENSPARK_RETRIES      task retries (default 0 here, so that a failure shows at once)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"   # the job runs in this cwd: relative paths in the config (model, caches) are from the repo root
say() { echo "[airflow-test] $*"; }

DATE=${1:?usage: scripts/airflow-test.sh LOGICAL_DATE (YYYY-MM-DD)}
DAG_ID=qwenspark_hotel_sentiment_nightly
VENV=$ROOT/.venv-airflow
# The versions this was tested with (scripts/airflow-test.sh, tests/spark/test_airflow_dag.py).
PINS=(apache-airflow==3.3.2 apache-airflow-providers-apache-spark==6.3.4)
STAMP=$VENV/.installed-$(echo "${PINS[*]}" | tr ' =' '_-')

if [ -f "$STAMP" ]; then
  say "Airflow venv: present ($VENV)"
else
  say "creating $VENV with ${PINS[*]} (first time: about 1 min, 0.7 GB)"
  test -x "$VENV/bin/python" || python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
  # pip's find-links warnings about absent local mirrors are noise; real errors still fail the step.
  "$VENV/bin/pip" install -q --no-cache-dir --disable-pip-version-check "${PINS[@]}" 2> >(grep -v "^WARNING: Location" >&2)
  touch "$STAMP"
fi

export AIRFLOW_HOME=${AIRFLOW_HOME:-$ROOT/.run/airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$ROOT/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export QWENSPARK_HOME=$ROOT
export QWENSPARK_CONFIG=${QWENSPARK_CONFIG:-$ROOT/conf/local.yaml}
export QWENSPARK_PYTHON=${QWENSPARK_PYTHON:-$ROOT/.venv/bin/python}
export QWENSPARK_RETRIES=${QWENSPARK_RETRIES:-0}
export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
# The Spark connection the DAG uses, as JSON (the URI form spark://local[2] is misread as yarn).
CONN=${QWENSPARK_SPARK_CONN:-spark_qwenspark}
export "AIRFLOW_CONN_${CONN^^}"='{"conn_type": "spark", "host": "local[2]"}'
mkdir -p "$AIRFLOW_HOME"

# Migrated once per Airflow version (a few seconds each time otherwise).
MIGRATED=$AIRFLOW_HOME/.migrated-$(basename "$STAMP")
if [ -f "$MIGRATED" ] && [ -f "$AIRFLOW_HOME/airflow.db" ]; then
  say "metadata DB: up to date ($AIRFLOW_HOME/airflow.db)"
else
  say "airflow db migrate (SQLite in $AIRFLOW_HOME)"
  "$VENV/bin/airflow" db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1 \
    || { tail -30 "$AIRFLOW_HOME/migrate.log" >&2; exit 1; }
  touch "$MIGRATED"
fi

say "airflow dags test $DAG_ID $DATE  (config $QWENSPARK_CONFIG, connection $CONN = local[2])"
say "data interval of this manual test run: the day that ends at $DATE 00:00 UTC"
exec "$VENV/bin/airflow" dags test "$DAG_ID" "$DATE"
