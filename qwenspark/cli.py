"""The `qwenspark` command line: batch, stream, eval, dashboard, init-db, purge-deleted, load-reviews, fetch-model..."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from qwenspark.config import DbConfig, QwenSparkConfig, load_config
from qwenspark.errors import ConfigError, as_qwenspark_error, one_line

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("qwenspark")
T = TypeVar("T")

CONFIG_ENV = "QWENSPARK_CONFIG"
DEFAULT_CONFIG = Path("conf/local.yaml")
# Config templates shipped in the package (qwenspark/templates/NAME.yaml: links to conf/NAME.yaml).
TEMPLATES = ("local", "cluster-gpu")
# Exit codes: a setting or a grant to fix (rerunning will not help), and a runtime failure (a rerun may).
EXIT_CONFIG = 2
EXIT_RUNTIME = 1
# Commands that log in as the schema owner (db.admin_user): their login errors name its keys.
AS_OWNER = ("init-db", "load-reviews")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help=f"YAML config (default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} in the current folder; "
        "`qwenspark config-template` prints a starting point)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set engine.batch_size=16 (repeatable; never a password)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwenspark", description=__doc__)
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    parser.add_argument("--debug", action="store_true", help="log at debug level, with the traceback of a failure")
    sub = parser.add_subparsers(dest="command", required=True)
    _config_args(sub.add_parser("batch", help="analyse new or changed reviews and upsert the results"))
    _config_args(sub.add_parser("stream", help="analyse new reviews as they arrive (Structured Streaming)"))
    ev = sub.add_parser("eval", help="run the pipeline on a labelled CSV and print quality and speed")
    _config_args(ev)
    ev.add_argument("--input", type=Path, help="CSV with source_id, lang, text, rating, label")
    ev.add_argument("--limit", type=int, help="rows to use, split evenly across languages (seeded sample)")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed for --limit")
    ev.add_argument("--exclude-sample", action="append", default=[], type=_sample_arg, metavar="N:SEED",
                    help="leave out the rows that --limit N --seed SEED picks (held-out reports; repeatable)")
    ev.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    ev.add_argument("--out", type=Path, help="also write the figures' JSON to this file (for --compare)")
    ev.add_argument("--rows-out", type=Path, metavar="CSV",
                    help="also write each row's answer and flags (correct, copied, borrowed, at bound) to this CSV")
    ev.add_argument("--compare", nargs=2, type=Path, metavar=("A.json", "B.json"),
                    help="print two runs' figures (files from --out or --json) side by side; runs nothing")
    dash = sub.add_parser(
        "dashboard", help="serve the web dashboard over the result views, as the read-only db.dashboard_user")
    _config_args(dash)
    dash.add_argument("--host", help="address to bind (default: dashboard.host, 127.0.0.1)")
    dash.add_argument("--port", type=int, help="TCP port (default: dashboard.port, 8050)")
    srv = sub.add_parser(
        "serve", help="analyse reviews on request over HTTP (POST /v1/analyze, /healthz, /metrics) with the job's "
        "prompt and parsing; serve.store writes the answers through to review_sentiment")
    _config_args(srv)
    srv.add_argument("--host", help="address to bind (default: serve.host, 127.0.0.1; any other needs an API key)")
    srv.add_argument("--port", type=int, help="TCP port (default: serve.port, 8060)")
    _config_args(sub.add_parser(
        "init-db",
        help="as the schema owner (db.admin_user): apply the schema migrations, (re)create the dashboard views, "
        "grant db.job_role and db.dashboard_role their privileges"))
    _config_args(sub.add_parser(
        "purge-deleted",
        help="remove the results of reviews deleted from source.table, and their share of the aggregates (what "
        "job.purge_deleted does at the start of a batch run); only where source.table holds every analysed review"))
    ld = sub.add_parser(
        "load-reviews", help="insert reviews from a CSV into hotel_reviews as the schema owner (idempotent)"
    )
    _config_args(ld)
    ld.add_argument("--input", type=Path, default=Path("data/demo/hotel_reviews_demo.csv"))
    from qwenspark.models.default import CATALOGUE  # stdlib only: the driver stays light

    fetch = sub.add_parser(
        "fetch-model",
        help="download and convert the pinned model engine.default_model selects (the default one when it is "
        "false) into engine.model's parent folder",
    )
    _config_args(fetch)
    fetch.add_argument(
        "--model",
        choices=list(CATALOGUE),
        help="this pinned model instead (its folder, beside engine.model, is printed)",
    )
    tpl = sub.add_parser(
        "config-template",
        help="print a config template shipped with the package, e.g. `qwenspark config-template cluster-gpu > my.yaml`",
    )
    tpl.add_argument("name", choices=TEMPLATES, help="local: embedded MariaDB + CPU model; cluster-gpu: vLLM on GPUs")
    return parser


def template_text(name: str) -> str:
    """The packaged config template NAME (one of TEMPLATES) as text."""
    from importlib import resources

    if name not in TEMPLATES:
        raise ConfigError(f"no config template {name!r}; choose one of {', '.join(TEMPLATES)}")
    text = (resources.files("qwenspark") / "templates" / f"{name}.yaml").read_text(encoding="utf-8")
    # conf/local.yaml names the checkout's .cache and .run, above conf/; a copy keeps them beside itself.
    return text.replace("${CONFIG_DIR}/../", "${CONFIG_DIR}/")


def resolve_config_path(given: str | None) -> Path:
    """--config, else $QWENSPARK_CONFIG, else conf/local.yaml if the current folder has it (a checkout)."""
    if given:
        return Path(given)
    from_env = os.environ.get(CONFIG_ENV)
    if from_env:
        return Path(from_env)
    if DEFAULT_CONFIG.is_file():
        return DEFAULT_CONFIG
    raise ConfigError(
        f"no config: pass --config FILE or set ${CONFIG_ENV} ({DEFAULT_CONFIG} is only found in a qwenspark "
        f"checkout and {Path.cwd()} has none); write one with `qwenspark config-template local > my.yaml` "
        "(or cluster-gpu)"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `qwenspark` command and of jobs/*.py."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "mysql.connector"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg: QwenSparkConfig | None = None
    try:
        if args.command == "config-template":
            sys.stdout.write(template_text(args.name))
            return 0
        if args.command == "eval" and args.compare:
            return _compare(args.compare)
        if args.command == "eval" and args.input is None:
            raise ConfigError("eval: --input CSV is required (or --compare A.json B.json)")
        if args.command == "eval":
            for flag, path in (("--out", args.out), ("--rows-out", args.rows_out)):
                if path is not None and not path.resolve().parent.is_dir():  # found now, not after the whole run
                    raise ConfigError(f"eval: {flag} {path}: folder {path.resolve().parent} does not exist")
        cfg = load_config(resolve_config_path(args.config), args.overrides)
        return int(_COMMANDS[args.command](cfg, args))
    except Exception as exc:  # every failure ends as one line and an exit code; the traceback at debug level
        db = None if cfg is None else cfg.db.owner() if args.command in AS_OWNER else (
            cfg.db.dashboard() if args.command == "dashboard" else cfg.db)
        return fail(exc, db)


def fail(exc: BaseException, db: DbConfig | None = None) -> int:
    """Print the one `qwenspark: error: ...` line for exc; returns EXIT_CONFIG or EXIT_RUNTIME."""
    error = as_qwenspark_error(exc, db)
    log.debug("the failure's traceback", exc_info=exc)
    print(f"qwenspark: error: {one_line(error)}", file=sys.stderr)
    return EXIT_CONFIG if isinstance(error, ConfigError) else EXIT_RUNTIME


def _with_spark(cfg: QwenSparkConfig, work: Callable[[SparkSession, QwenSparkConfig], T]) -> tuple[QwenSparkConfig, T]:
    """Fetch the model if asked, start Spark, run work, stop Spark; returns (the prepared config, work's result)."""
    from qwenspark.pipeline import prepare_model
    from qwenspark.session import spark_session

    cfg = prepare_model(cfg)
    spark = spark_session(cfg)
    try:
        return cfg, work(spark, cfg)
    finally:
        spark.stop()


def _batch(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark import preflight

    preflight.check(cfg, "batch")  # before the job's imports (pandas, Spark): a bad setting answers at once
    from qwenspark.pipeline import run_batch
    from qwenspark.report import print_summary

    cfg, summary = _with_spark(cfg, run_batch)
    print_summary(cfg, summary)
    return 0


def _stream(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark import preflight

    preflight.check(cfg, "stream")
    from qwenspark.report import print_stream
    from qwenspark.stream import run_stream

    cfg, report = _with_spark(cfg, run_stream)
    print_stream(cfg, report)
    return 0


def _eval(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark import preflight

    preflight.check(cfg, "eval")
    from qwenspark.evaluate import load_labelled, run_eval
    from qwenspark.report import print_eval

    labelled = load_labelled(args.input, args.limit, args.seed, exclude=args.exclude_sample)
    cfg, report = _with_spark(cfg, lambda spark, c: run_eval(spark, c, labelled, args.rows_out))
    print_eval(report)
    figures = report.as_dict()
    if args.json:
        print(json.dumps(figures, sort_keys=True, ensure_ascii=False))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def _sample_arg(raw: str) -> tuple[int, int]:
    limit, _, seed = raw.partition(":")
    try:
        return int(limit), int(seed)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N:SEED (e.g. 120:3), got {raw!r}") from None


def _compare(paths: list[Path]) -> int:
    """`eval --compare A B`: two reports, each a JSON file or an --json output (its last line), side by side."""
    from qwenspark.report import print_compare

    reports = []
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").strip().splitlines()
            last = lines[-1] if lines else ""
            reports.append(json.loads(last if last.startswith("{") and last.endswith("}") else "\n".join(lines)))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"eval --compare: cannot read {path}: {exc}") from exc
    print_compare(reports[0], reports[1], (paths[0].stem, paths[1].stem))
    return 0


def _init_db(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark.io import grants, migrate

    applied = migrate.migrate(cfg.db)
    granted_sql = grants.apply(cfg)
    done = f"applied v{', v'.join(f'{v:03d}' for v in applied)}" if applied else "nothing to apply"
    roles = " and ".join(r for r in (cfg.db.job_role, cfg.db.dashboard_role) if r)
    granted = f"{len(granted_sql)} grants to {roles}" if roles else "no grants: db.job_role, db.dashboard_role unset"
    print(f"schema at version {migrate.LATEST} in {cfg.db.database} on {cfg.db.host}:{cfg.db.port} as "
          f"{cfg.db.owner().user} ({done}; {granted})")
    return 0


def _purge_deleted(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark.io.migrate import require_current
    from qwenspark.io.mysql import purge_deleted

    require_current(cfg.db)
    purged = purge_deleted(cfg.db, cfg.source, chunk_rows=cfg.sink.commit_chunk_rows)
    print(f"{purged} result(s) of reviews no longer in {cfg.source.table} removed, with their share of the aggregates")
    return 0


def _load_reviews(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark.io.migrate import require_current
    from qwenspark.io.mysql import load_reviews_csv

    # The reviews are the user's application's data: written as the schema owner, never by the job's account.
    owner = cfg.db.owner()
    require_current(owner)
    total, changed = load_reviews_csv(owner, args.input)
    print(f"{total} reviews in {args.input}: {changed} rows inserted or changed in hotel_reviews")
    return 0


def _dashboard(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    import mysql.connector

    from qwenspark.dashboard.app import serve

    try:
        serve(cfg, args.host, args.port)
    except mysql.connector.errors.ProgrammingError as exc:
        if exc.errno == 1146:  # no such table: the views of this release are not there yet
            raise ConfigError(f"the dashboard views are missing in {cfg.db.database}: run `qwenspark init-db` "
                              "(as the schema owner) first") from None
        if exc.errno in (1142, 1143):
            raise ConfigError(f"{cfg.db.dashboard_user} may not read the dashboard views: give it db.dashboard_role "
                              "as its default role and run `qwenspark init-db`") from None
        raise
    return 0


def _serve(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark.pipeline import prepare_model
    from qwenspark.serve.app import check_bind, serve

    check_bind(args.host or cfg.serve.host, cfg.serve.api_key())  # before fetching or loading anything
    serve(prepare_model(cfg), args.host, args.port)
    return 0


def _fetch_model(cfg: QwenSparkConfig, args: argparse.Namespace) -> int:
    from qwenspark.models.default import DEFAULT, ensure_model, pinned

    name = args.model or (pinned(cfg.engine.default_model) or DEFAULT).name
    print(ensure_model(Path(cfg.engine.model).parent, name))
    return 0


_COMMANDS = {
    "batch": _batch,
    "stream": _stream,
    "eval": _eval,
    "dashboard": _dashboard,
    "serve": _serve,
    "init-db": _init_db,
    "purge-deleted": _purge_deleted,
    "load-reviews": _load_reviews,
    "fetch-model": _fetch_model,
}

if __name__ == "__main__":
    sys.exit(main())
