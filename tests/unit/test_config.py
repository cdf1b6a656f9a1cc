"""Config: YAML + overrides load typed; bad keys and secrets on argv fail with the key named."""

from datetime import datetime
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
    assert cfg.source.created_from == datetime(2026, 11, 1)
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
