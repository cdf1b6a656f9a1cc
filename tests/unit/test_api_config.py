"""qwenspark.api.resolve_config: a config from an object, a mapping, a YAML path or nothing, with keyword overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from qwenspark.api import _embedded_default, resolve_config
from qwenspark.config import load_config, validate_config
from qwenspark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ECHO = {"engine": {"kind": "custom", "factory": "tests.support.echo_engine:build", "model": "echo"}}


def test_a_mapping_with_keyword_overrides_by_double_underscore() -> None:
    cfg = resolve_config(ECHO, engine__batch_size=8, prompt__version="v4", clean__max_chars=500)
    assert (cfg.engine.batch_size, cfg.prompt.version, cfg.clean.max_chars) == (8, "v4", 500)
    assert ECHO["engine"].get("batch_size") is None, "the caller's mapping is not written into"


def test_an_object_and_a_yaml_path_give_the_same_config() -> None:
    from_path = resolve_config(ROOT / "conf" / "local.yaml", engine__default_model=False)
    from_object = resolve_config(load_config(ROOT / "conf" / "local.yaml"), engine__default_model=False)
    assert from_path == from_object
    assert from_path.engine.default_model is False and from_path.engine.batch_size == 32


def test_a_bad_override_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"engine\.batch_size"):
        resolve_config(ECHO, engine__batch_size=0)


def test_nothing_means_the_embedded_cpu_default_under_the_cache(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("QWENSPARK_CACHE", str(tmp_path))
    cfg = validate_config(_embedded_default())  # validated only: resolving it would fetch the model
    assert cfg.engine.kind == "vllm" and cfg.engine.default_model is True
    assert cfg.engine.model == str(tmp_path / "models" / "qwen2.5-coder-0.5b-instruct")
    assert cfg.engine.env["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm")
    local = load_config(Path(__file__).parents[2] / "conf" / "local.yaml")
    assert cfg.prompt.version == local.prompt.version, "the API's default prompt is the job's, for the same model"


@pytest.mark.parametrize("on", [False, True])
def test_the_column_functions_spec_carries_prompt_aspect_evidence(on: bool) -> None:
    from qwenspark.api import _spec

    spec, _ = _spec(resolve_config(ECHO, prompt__aspect_evidence=on), None)
    assert spec.aspect_evidence is on
