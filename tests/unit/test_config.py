"""Config: YAML + overrides load typed; bad keys and secrets on argv fail with the key named."""

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from qwenspark.config import load_config
from qwenspark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "conf" / "local.yaml"


def test_local_config_loads_and_overrides_are_typed() -> None:
    cfg = load_config(LOCAL, ["engine.batch_size=7", "job.reprocess=true", "source.created_from=2026-11-01"])
    assert cfg.engine.batch_size == 7
    assert cfg.job.reprocess is True
    assert cfg.source.created_from == datetime(2026, 11, 1, tzinfo=UTC)
    assert cfg.engine.kind == "vllm"


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"engine\.batchsize"):
        load_config(LOCAL, ["engine.batchsize=7"])


def test_bad_value_is_named() -> None:
    with pytest.raises(ConfigError, match=r"engine\.batch_size"):
        load_config(LOCAL, ["engine.batch_size=0"])


def test_password_never_from_argv() -> None:
    with pytest.raises(ConfigError, match="never go on the command line"):
        load_config(LOCAL, ["db.password=hunter2"])


def test_password_from_env_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    cfg = load_config(LOCAL, [f"db.password_file={secret}", "db.password_env=QS_TEST_PW"])
    monkeypatch.delenv("QS_TEST_PW", raising=False)
    assert cfg.db.password().get_secret_value() == "from-file"
    monkeypatch.setenv("QS_TEST_PW", "from-env")
    assert cfg.db.password().get_secret_value() == "from-env"
    assert "from-env" not in repr(cfg) and "from-env" not in str(cfg.db.password())


def test_missing_password_says_where_to_put_it(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(LOCAL, ["db.password_file=null", "db.password_env=QS_TEST_NONE"])
    monkeypatch.delenv("QS_TEST_NONE", raising=False)
    with pytest.raises(ConfigError, match=r"\$QS_TEST_NONE"):
        cfg.db.password()


def test_config_hash_tracks_results_not_spark() -> None:
    base = load_config(LOCAL)
    assert base.config_hash() == load_config(LOCAL, ["spark.master=local[4]"]).config_hash()
    assert base.config_hash() != load_config(LOCAL, ["prompt.version=v2"]).config_hash()


def test_jdbc_url_uses_mysql_dialect() -> None:
    assert load_config(LOCAL).db.jdbc_url().startswith("jdbc:mysql://127.0.0.1:13306/qwenspark?")


@pytest.mark.parametrize(
    "key",
    [
        "engine.batch_size",
        "engine.temperature",
        "engine.max_tokens",
        "engine.gpu_memory_utilization",
        "db.port",
        "source.num_partitions",
        "source.min_id",
        "job.slots",
        "job.max_error_rate",
        "stream.trigger_seconds",
        "stream.start_after_id",
    ],
)
@pytest.mark.parametrize("flag", ["true", "false"])
def test_a_boolean_is_not_a_number(key: str, flag: str) -> None:
    # pydantic takes true as 1: engine.batch_size=true ran with batches of one.
    with pytest.raises(ConfigError, match=rf"{key.replace('.', r'[.]')}: expected a number, got {flag}"):
        load_config(LOCAL, [f"{key}={flag}"])


def test_booleans_still_set_boolean_fields() -> None:
    cfg = load_config(LOCAL, ["engine.guided=false", "job.reprocess=true", "stream.available_now=true"])
    assert (cfg.engine.guided, cfg.job.reprocess, cfg.stream.available_now) == (False, True, True)


def test_unknown_prompt_version_fails_at_load() -> None:
    with pytest.raises(ConfigError, match=r"prompt\.version: unknown 'v77'; known: v1, v2, v3"):
        load_config(LOCAL, ["prompt.version=v77"])


def test_default_model_needs_the_default_models_folder() -> None:
    # It used to fetch the default model and run it under the user's model name.
    with pytest.raises(ConfigError, match=r"engine: default_model: true .* set engine\.model to /m/qwen2\.5-coder"):
        load_config(LOCAL, ["engine.model=/m/my-qwen3-8b"])
    own = load_config(LOCAL, ["engine.model=/m/my-qwen3-8b", "engine.default_model=false"])
    assert own.engine.default_model is False
    assert load_config(LOCAL, ["engine.model=/m/qwen2.5-coder-0.5b-instruct"]).engine.default_model is True


def test_config_checks_import_no_torch() -> None:
    code = (
        "import sys\n"
        "from qwenspark.config import load_config\n"
        f"load_config({str(LOCAL)!r}, ['prompt.version=v2'])\n"
        "print(','.join(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("content", ["", "\n", "  \nsecond-line\n"])
def test_empty_password_file_fails_at_load(tmp_path: Path, content: str, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text(content)
    monkeypatch.delenv("QS_TEST_PW", raising=False)
    with pytest.raises(ConfigError, match=rf"db\.password_file: {secret} is empty: its first line must be"):
        load_config(LOCAL, [f"db.password_file={secret}", "db.password_env=QS_TEST_PW"])
    # Not read, so not refused, when the env variable holds the password.
    monkeypatch.setenv("QS_TEST_PW", "from-env")
    load_config(LOCAL, [f"db.password_file={secret}", "db.password_env=QS_TEST_PW"])


def test_password_file_emptied_after_load_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("pw\n")
    monkeypatch.delenv("QS_TEST_PW", raising=False)
    cfg = load_config(LOCAL, [f"db.password_file={secret}", "db.password_env=QS_TEST_PW"])
    secret.write_text("")  # it said "list index out of range"
    with pytest.raises(ConfigError, match=rf"^db\.password_file: {secret} is empty"):
        cfg.db.password()
    secret.unlink()
    with pytest.raises(ConfigError, match=rf"^db\.password_file: {secret} cannot be read: No such file"):
        cfg.db.password()


def test_password_source_names_where_not_what(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    cfg = load_config(LOCAL, [f"db.password_file={secret}", "db.password_env=QS_TEST_PW"])
    monkeypatch.delenv("QS_TEST_PW", raising=False)
    assert cfg.db.password_source() == f"db.password_file ({secret})"
    monkeypatch.setenv("QS_TEST_PW", "s3cret")
    assert cfg.db.password_source() == "$QS_TEST_PW"


WINDOW_CASES = [
    ("2026-11-01", "2026-11-01T00:00:00+00:00"),
    ("2026-11-01 16:00:00", "2026-11-01T16:00:00+00:00"),
    ("2026-11-01T16:00:00+08:00", "2026-11-01T08:00:00+00:00"),
    ("2026-11-01T16:00:00-08:00", "2026-11-02T00:00:00+00:00"),
    ("2026-11-01T16:00:00Z", "2026-11-01T16:00:00+00:00"),
]


@pytest.mark.parametrize(("given", "utc"), WINDOW_CASES)
def test_window_bounds_are_aware_utc(given: str, utc: str, tmp_path: Path) -> None:
    # Through --set and through a YAML file: YAML reads both forms as datetimes (or a date) of its own.
    from_set = load_config(LOCAL, [f"source.created_from={given}"]).source.created_from
    path = tmp_path / "window.yaml"
    path.write_text(f"engine:\n  model: m\nsource:\n  created_until: {given}\n")
    from_file = load_config(path).source.created_until
    assert from_set is not None and from_file is not None
    assert from_set.isoformat() == from_file.isoformat() == utc
    assert from_set.tzinfo is UTC


def test_window_bounds_do_not_depend_on_the_process_zone(tmp_path: Path) -> None:
    # The driver of issue 9 ran in UTC+8 and lost 16:00-24:00 UTC every night.
    code = (
        "from qwenspark.config import load_config\n"
        f"for given, _ in {WINDOW_CASES!r}:\n"
        f"    print(load_config({str(LOCAL)!r}, [f'source.created_from={{given}}']).source.created_from.isoformat())\n"
    )
    seen = {}
    for zone in ("Asia/Shanghai", "America/Los_Angeles", "UTC"):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "TZ": zone}
        )
        seen[zone] = out.stdout.split()
    assert seen["Asia/Shanghai"] == seen["America/Los_Angeles"] == seen["UTC"] == [utc for _, utc in WINDOW_CASES]


def test_window_must_select_something() -> None:
    with pytest.raises(ConfigError, match=r"source: created_from 2026-11-02T00:00:00\+00:00 is not before"):
        load_config(LOCAL, ["source.created_from=2026-11-02", "source.created_until=2026-11-02T08:00:00+08:00"])


def test_window_column_is_created_at_or_updated_at() -> None:
    from qwenspark.io.jdbc import source_predicate

    assert load_config(LOCAL).source.window_column == "created_at"
    cfg = load_config(LOCAL, ["source.window_column=updated_at", "source.created_from=2026-11-02T08:00:00+08:00",
                              "source.created_until=2026-11-03", "source.max_id=9"])
    assert source_predicate(cfg) == ("1 = 1 AND review_id <= 9 AND updated_at >= '2026-11-02 00:00:00.000000'"
                                     " AND updated_at < '2026-11-03 00:00:00.000000'")
    with pytest.raises(ConfigError, match=r"source.window_column: Input should be 'created_at' or 'updated_at'"):
        load_config(LOCAL, ["source.window_column=modified_at; DROP TABLE x"])
    assert not load_config(LOCAL).job.purge_deleted


def test_max_error_rate_is_a_share() -> None:
    assert load_config(LOCAL).job.max_error_rate == 0.05
    assert load_config(LOCAL, ["job.max_error_rate=0"]).job.max_error_rate == 0.0
    for bad in ("-0.1", "1.5"):
        with pytest.raises(ConfigError, match=r"job\.max_error_rate"):
            load_config(LOCAL, [f"job.max_error_rate={bad}"])


def test_several_service_engines_need_vllm_and_room_on_the_gpu() -> None:
    assert load_config(LOCAL, ["serve.engines=3", "engine.gpu_memory_utilization=0.3"]).serve.engines == 3
    with pytest.raises(ConfigError, match=r"needs engine\.kind vllm"):
        load_config(LOCAL, ["serve.engines=2", "engine.kind=transformers"])
    # the service's share is split among its engines (resources.share_gpu_memory): any share fits
    assert load_config(LOCAL, ["serve.engines=3", "engine.gpu_memory_utilization=0.9"]).serve.engines == 3


def test_the_shipped_config_finds_the_checkout_from_any_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # a user in another folder: conf/local.yaml's paths are the checkout's, not the cwd's
    cfg = load_config(LOCAL)
    assert cfg.engine.model == str(ROOT / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct")
    assert cfg.db.password_file == ROOT / ".run" / "mariadb" / "qwenspark.password"
    assert cfg.db.dashboard_password_file == ROOT / ".run" / "mariadb" / "qwenspark-dashboard.password"
    assert cfg.engine.env["VLLM_CACHE_ROOT"] == str(ROOT / ".cache" / "vllm")
    assert cfg.stream.checkpoint_location == str(ROOT / ".run" / "checkpoints" / "hotel_sentiment_stream")
    assert "CONFIG_DIR" not in json.dumps(cfg.model_dump(mode="json"))


def test_config_dir_is_the_files_folder_and_plain_paths_stay_the_cwds(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "my.yaml"
    conf.parent.mkdir()
    conf.write_text("engine:\n  kind: transformers\n  model: ${CONFIG_DIR}/m\n  tokenizer: tok\n"
                    "  env:\n    A: x-${CONFIG_DIR}\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(Path("etc/my.yaml"), ["engine.max_tokens=8", "db.password_file=${CONFIG_DIR}/../pw"])
    assert cfg.engine.model == str(tmp_path / "etc" / "m")
    assert cfg.engine.tokenizer == "tok", "a plain relative path is left to the working folder"
    assert cfg.engine.env["A"] == f"x-{tmp_path / 'etc'}", "inside a value: replaced, not normalised"
    assert cfg.db.password_file == tmp_path / "pw", "an override may name it too"
