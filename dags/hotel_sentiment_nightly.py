"""Airflow DAG `qwenspark_hotel_sentiment_nightly`: each night, analyse the reviews inserted or changed the day
before, and drop the results of reviews deleted since.

One task, a `SparkSubmitOperator` that runs `jobs/hotel_sentiment.py` with the run's data interval as the
review window on the change watermark (`source.window_column=updated_at`: `source.created_from` <= updated_at <
`source.created_until`, UTC), so new reviews, edited ones and late inserts with an old created_at are all
selected; an edited review's text gives it a new input_key and it is analysed again, an unchanged one (a rating
edit) is skipped as current. `job.purge_deleted=true` first removes the results of reviews no longer in the
source table, with their share of the aggregates. The source table needs `updated_at` (hotel_reviews has it from
schema v004, `qwenspark init-db`). The job does all the work and is idempotent (results are keyed by review and
input hash), so Airflow retries and backfills are safe: a replayed day changes 0 rows.

Schedule: daily at 00:00 UTC with `CronDataIntervalTimetable`, so the run with logical date D covers
[D, D+1) and starts just after D+1 00:00. This is explicit on purpose: in Airflow 3 `schedule="@daily"`
means `CronTriggerTimetable` ([scheduler] create_cron_data_intervals=False), whose data interval is one
point in time (start == end), i.e. an empty review window. `catchup=True`: runs from the start date up to
now are created (backfills), one at a time (`max_active_runs=1`).

Install (a venv of its own: the Spark provider pulls `pyspark-client`, which overwrites the real pyspark
of the project's `.venv`):

    python3.11 -m venv .venv-airflow
    .venv-airflow/bin/pip install apache-airflow==3.3.2 apache-airflow-providers-apache-spark==6.3.4
    cp dags/hotel_sentiment_nightly.py "$AIRFLOW_HOME/dags/"      # or point [core] dags_folder at dags/

Test locally (SQLite metadata DB, no scheduler, the task runs in the foreground):

    scripts/airflow-test.sh 2026-11-02        # creates .venv-airflow if needed, runs `airflow dags test`
    .venv/bin/python -m pytest -q tests/spark/test_airflow_dag.py

Note: `airflow dags test DAG D` infers a *manual* run's interval, the whole period that ends at D:
[D-1, D), not the [D, D+1) of the scheduled run with logical date D.

Settings (environment of the DAG processor and the worker; all optional):

| variable | default | meaning |
|---|---|---|
| QWENSPARK_HOME | the repo holding this file | root of the qwenspark checkout on the worker |
| QWENSPARK_CONFIG | $QWENSPARK_HOME/conf/local.yaml | job config (relative paths: cwd; `${CONFIG_DIR}`: its folder) |
| QWENSPARK_PYTHON | $QWENSPARK_HOME/.venv/bin/python | python of the Spark venv (its bin/ also holds spark-submit) |
| QWENSPARK_SPARK_HOME | pyspark inside that venv | SPARK_HOME given to spark-submit |
| QWENSPARK_JDBC_JAR | /usr/share/java/mariadb-java-client.jar | MariaDB Connector/J |
| QWENSPARK_SPARK_CONN | spark_qwenspark | Airflow connection naming the master, e.g. local[2] or yarn |
| QWENSPARK_START_DATE | 2026-11-01 | first day processed (UTC) |
| QWENSPARK_RETRIES, QWENSPARK_RETRY_DELAY_MIN | 2, 10 | task retries and the pause between them |
| QWENSPARK_TIMEOUT_MIN | 360 | execution_timeout of one attempt |
| QWENSPARK_WINDOW_LOOKBACK_MIN | 0 | start each night's window this many minutes earlier (see below) |

updated_at is stamped by the server when a statement writes the row, in the writer's session time zone. A
writer whose session is not in UTC, or whose transaction commits after the night's run has read, stamps a time
the window has passed: give such writers a UTC session (or the server `default_time_zone='+00:00'`), or set
QWENSPARK_WINDOW_LOOKBACK_MIN to cover the gap (the reviews read twice are skipped as current: only read).

The database password never appears in the DAG, its arguments or `env_vars` (rendered template fields are
stored in Airflow's database and shown in the UI; on YARN `env_vars` even become `--conf` arguments). The
job reads it from the variable named by `db.password_env` (default QWENSPARK_DB_PASSWORD) or from
`db.password_file`. spark-submit inherits the worker's environment, so give it to the worker:
- from the secret store that feeds the worker's environment: a Kubernetes Secret as an env var of the
  worker pod, a systemd `EnvironmentFile=` (mode 600) of the Celery worker, Vault agent templating, ...;
- or a password file readable only by the worker's user, named by `db.password_file` in the config.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, CronDataIntervalTimetable

DAG_ID = "qwenspark_hotel_sentiment_nightly"
# The DAG file may be copied into another dags folder; QWENSPARK_HOME then says where the checkout is.
HOME = Path(os.environ.get("QWENSPARK_HOME", Path(__file__).resolve().parents[1]))
CONFIG = os.environ.get("QWENSPARK_CONFIG", str(HOME / "conf" / "local.yaml"))
# Not resolved: .venv/bin/python is a symlink to the base interpreter, and the venv is what matters.
PYTHON = Path(os.environ.get("QWENSPARK_PYTHON", str(HOME / ".venv" / "bin" / "python")))
JDBC_JAR = os.environ.get("QWENSPARK_JDBC_JAR", "/usr/share/java/mariadb-java-client.jar")
SPARK_CONN = os.environ.get("QWENSPARK_SPARK_CONN", "spark_qwenspark")
# A date without an offset means UTC midnight (the default timezone of a worker may be anything).
_START = datetime.fromisoformat(os.environ.get("QWENSPARK_START_DATE", "2026-11-01"))
START_DATE = _START if _START.tzinfo else _START.replace(tzinfo=UTC)
RETRIES = int(os.environ.get("QWENSPARK_RETRIES", "2"))
RETRY_DELAY = timedelta(minutes=float(os.environ.get("QWENSPARK_RETRY_DELAY_MIN", "10")))
TIMEOUT = timedelta(minutes=float(os.environ.get("QWENSPARK_TIMEOUT_MIN", "360")))
# Jinja: the run's interval as the job's window, in UTC (Airflow's intervals are UTC datetimes).
# YAML reads "2026-11-02 00:00:00" as a timestamp, which the job's config validates as a datetime.
LOOKBACK_MIN = float(os.environ.get("QWENSPARK_WINDOW_LOOKBACK_MIN", "0"))
_FROM = "data_interval_start"
_FROM_EXPR = f"({_FROM} - macros.timedelta(minutes={LOOKBACK_MIN}))" if LOOKBACK_MIN else _FROM
WINDOW_FROM = "source.created_from={{ " + _FROM_EXPR + ".in_timezone('UTC').strftime('%Y-%m-%d %H:%M:%S') }}"
WINDOW_UNTIL = "source.created_until={{ data_interval_end.in_timezone('UTC').strftime('%Y-%m-%d %H:%M:%S') }}"
# The window is on the change watermark, and reviews deleted from the source lose their results.
CHANGES = ["--set", "source.window_column=updated_at", "--set", "job.purge_deleted=true"]


def _spark_home(python: Path) -> str | None:
    """SPARK_HOME of the pip-installed pyspark in the venv of `python` (None: let spark-submit find it)."""
    if "QWENSPARK_SPARK_HOME" in os.environ:
        return os.environ["QWENSPARK_SPARK_HOME"]
    found = sorted(python.parent.parent.glob("lib/python3*/site-packages/pyspark"))
    return str(found[-1]) if found else None


def spark_env(python: Path = PYTHON) -> dict[str, str]:
    """Environment for spark-submit on top of the worker's own: which Spark and which Python; no secrets."""
    env = {
        # The provider only accepts a bare `spark-submit`: the Spark venv's bin/ goes first on PATH so that
        # it is this venv's spark-submit, not one of the Airflow venv or the system.
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        # Without these, Python workers start the system python and fail on `import pyarrow`.
        "PYSPARK_PYTHON": str(python),
        "PYSPARK_DRIVER_PYTHON": str(python),
    }
    spark_home = _spark_home(python)
    if spark_home:
        # An inherited SPARK_HOME of another Spark install would win over the venv's own otherwise.
        env["SPARK_HOME"] = spark_home
    for name in ("JAVA_HOME", "SPARK_LOCAL_IP", "QWENSPARK_CACHE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


with DAG(
    dag_id=DAG_ID,
    description="Sentiment, summary and aspects of the hotel reviews inserted or changed the day before (Spark + Qwen)",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=START_DATE,
    catchup=True,
    max_active_runs=1,
    default_args={
        "owner": "qwenspark",
        # The job is idempotent: a retry re-analyses only what the failed attempt did not commit.
        "retries": RETRIES,
        "retry_delay": RETRY_DELAY,
        "execution_timeout": TIMEOUT,
    },
    tags=["qwenspark", "spark"],
    doc_md=__doc__,
) as dag:
    SparkSubmitOperator(
        task_id="hotel_sentiment",
        conn_id=SPARK_CONN,
        application=str(HOME / "jobs" / "hotel_sentiment.py"),
        name="qwenspark-hotel-sentiment-{{ ds }}",
        jars=JDBC_JAR,
        conf={
            # The engine is cached per Python worker; without reuse every task would reload the model.
            "spark.python.worker.reuse": "true",
            # Under spark-submit the driver JVM exists before the job's own settings apply: the timezone
            # of the JDBC DATETIME columns (and so of the window) must be fixed here.
            "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
            "spark.sql.session.timeZone": "UTC",
            "spark.ui.showConsoleProgress": "false",
        },
        application_args=["--config", CONFIG, "--set", WINDOW_FROM, "--set", WINDOW_UNTIL, *CHANGES],
        env_vars=spark_env(),
    )
