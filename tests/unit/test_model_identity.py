"""The model identity that input_key names: content, not path; cached per file; a revision when asserted."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from qwenspark.config import EngineConfig
from qwenspark.errors import ConfigError
from qwenspark.models import identity
from qwenspark.models.identity import fingerprint, model_identity


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENSPARK_CACHE", str(tmp_path / "cache"))


def _model(folder: Path) -> Path:
    """A model folder as the converter leaves it: config, tokenizer, weights, a hidden marker, a README."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "tokenizer.json").write_text('{"vocab": {"a": 0}}')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / ".complete").write_text("marker")
    (folder / "README.md").write_text("docs")
    return folder


def _engine(model: Path | str, **extra: object) -> EngineConfig:
    return EngineConfig.model_validate({"model": str(model), **extra})


def test_moving_the_folder_keeps_the_identity_and_one_weight_byte_changes_it(tmp_path: Path) -> None:
    before = model_identity(_engine(_model(tmp_path / "a" / "m")))
    assert before.startswith("sha256:") and len(before) == len("sha256:") + 32
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(tmp_path / "a" / "m", moved)
    assert model_identity(_engine(moved)) == before
    # Markers and documentation do not shape outputs.
    (moved / ".complete").write_text("another marker")
    (moved / "README.md").write_text("other docs")
    assert model_identity(_engine(moved)) == before
    weights = moved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[1000] ^= 1
    weights.write_bytes(bytes(data))
    assert model_identity(_engine(moved)) != before


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_config_and_tokenizer_files_are_part_of_it(tmp_path: Path, name: str) -> None:
    folder = _model(tmp_path / "m")
    before = fingerprint(folder)
    (folder / name).write_text((folder / name).read_text() + " ")
    assert fingerprint(folder) != before


def test_a_file_swapped_behind_the_same_path_with_size_and_mtime_kept_changes_it(tmp_path: Path) -> None:
    # cp --preserve / rsync -a keep the mtime: the cache is keyed by ctime and inode too, which a copy cannot keep.
    folder = _model(tmp_path / "m")
    before = fingerprint(folder)
    weights = folder / "model.safetensors"
    st = weights.stat()
    swapped = tmp_path / "new.safetensors"
    swapped.write_bytes(bytes(reversed(weights.read_bytes())))
    os.replace(swapped, weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert weights.stat().st_size == st.st_size and weights.stat().st_mtime_ns == st.st_mtime_ns
    assert fingerprint(folder) != before


def test_digests_are_cached_so_a_large_model_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _model(tmp_path / "m")
    reads: list[str] = []
    real = identity._file_sha256

    def counting(path: Path) -> str:
        reads.append(path.name)
        return real(path)

    monkeypatch.setattr(identity, "_file_sha256", counting)
    first = fingerprint(folder)
    assert sorted(reads) == ["config.json", "model.safetensors", "tokenizer.json"]
    reads.clear()
    assert fingerprint(folder) == first and reads == []
    assert list((tmp_path / "cache" / "fingerprints").glob("*.json")), "the digests are kept on disk"
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    assert fingerprint(folder) != first and reads == ["config.json"]


def test_a_revision_when_asserted_and_the_name_for_a_hub_id(tmp_path: Path) -> None:
    folder = _model(tmp_path / "a" / "qwen")
    assert model_identity(_engine(folder, model_revision="abc123")) == "qwen@abc123"
    assert model_identity(_engine("Qwen/Qwen2.5-7B-Instruct")) == "Qwen/Qwen2.5-7B-Instruct"
    assert model_identity(_engine("Qwen/Qwen2.5-7B-Instruct", model_revision="c0ffee")) == (
        "Qwen/Qwen2.5-7B-Instruct@c0ffee"
    )
    # A separate tokenizer folder shapes outputs too.
    tok = _model(tmp_path / "tok")
    with_tok = model_identity(_engine(folder, tokenizer=str(tok)))
    assert with_tok.startswith(model_identity(_engine(folder)) + "+tokenizer:sha256:")


def test_the_tiny_test_model_has_an_identity(tiny_model: Path) -> None:
    ident = model_identity(_engine(tiny_model))
    assert ident.startswith("sha256:") and ident == model_identity(_engine(tiny_model))


def test_an_empty_model_folder_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no model files"):
        model_identity(_engine(tmp_path / "empty"))


def test_an_unwritable_cache_still_hashes_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("QWENSPARK_CACHE", str(blocked))
    folder = _model(tmp_path / "m")
    reads: list[str] = []
    real = identity._file_sha256
    monkeypatch.setattr(identity, "_file_sha256", lambda path: reads.append(path.name) or real(path))
    first = fingerprint(folder)
    assert len(reads) == 3
    assert fingerprint(folder) == first and len(reads) == 3, "the stream keys every micro-batch: no re-hash"
