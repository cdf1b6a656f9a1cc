"""The model's identity (driver side): what a result's input_key names instead of the model's path."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from qwenspark.config import EngineConfig
from qwenspark.errors import ConfigError

log = logging.getLogger(__name__)

# Files of a model folder that do not shape its outputs: documentation. Everything else (config, generation config,
# tokenizer files, chat template, weights, unknown files) is hashed: an unknown file re-analyses, never goes stale.
_DOC_PREFIXES = ("readme", "license", "licence", "notice", "use_policy")
_CHUNK = 8 << 20
# Once per process (and per change): the stream keys every micro-batch.
_warned: set[str] = set()
_logged: dict[str, str] = {}
_memo: dict[str, dict[str, object]] = {}  # folder -> its last digests, in case the disk cache cannot be written


def cache_root() -> Path:
    """Where file digests are kept between runs: $QWENSPARK_CACHE/fingerprints, else ~/.cache/qwenspark/..."""
    base = os.environ.get("QWENSPARK_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "qwenspark") / "fingerprints"


def model_identity(engine: EngineConfig) -> str:
    """A short string that changes when the model's outputs may: the asserted revision, else the content
    fingerprint of a local folder (and of a separate tokenizer folder), else the hub or server model name."""
    ident = _identity_of(engine.model, engine.model_revision)
    if engine.tokenizer and engine.tokenizer != engine.model:
        ident = f"{ident}+tokenizer:{_identity_of(engine.tokenizer, None)}"
    if _logged.get(engine.model) != ident:
        _logged[engine.model] = ident
        log.info("model %s: results keyed by its identity %s", engine.model, ident)
    return ident


def _identity_of(name: str, revision: str | None) -> str:
    path = Path(name).expanduser()
    is_dir = path.is_dir()
    if revision:
        # Asserted by the user (e.g. a hub commit): trusted, nothing read. A folder is named by its last part only,
        # so that moving the checkout does not change it.
        return f"{path.name if is_dir else name}@{revision}"
    if is_dir:
        return f"sha256:{fingerprint(path)[:32]}"
    # A hub id or a served model's name: all the driver can know. A path missing here (a model only on the
    # executors' disks) lands here too, so its key follows the path string: engine.model_revision pins it.
    if name.startswith(("/", ".", "~")) and name not in _warned:
        _warned.add(name)
        log.warning("engine.model %s is not a folder on the driver: results are keyed by the path, not the content"
                    " (set engine.model_revision to name the weights)", name)
    return name


def fingerprint(folder: Path) -> str:
    """sha256 over (path relative to folder, sha256 of the file) of every file that shapes the model's outputs.

    Moving or copying the folder keeps it; changing a byte of a weight, config or tokenizer file changes it. Each
    file's digest is cached under cache_root() by (size, mtime_ns, ctime_ns, inode), so a multi-GB model is read
    once, and again only when a file is replaced (a new ctime and inode even where a copy kept the mtime).
    """
    folder = folder.resolve()
    cache_file = cache_root() / f"{hashlib.sha256(str(folder).encode()).hexdigest()[:24]}.json"
    # The file on disk, else this process's own last pass (an unwritable cache must not re-hash every micro-batch).
    cached = _read_cache(cache_file) or _memo.get(str(folder), {})
    fresh: dict[str, list[object]] = {}
    total = hashlib.sha256()
    for rel, path in _model_files(folder):
        st = path.stat()  # follows links: a hub snapshot's files are links to blobs
        stamp: list[object] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        hit = cached.get(rel)
        digest = hit[-1] if isinstance(hit, list) and hit[:-1] == stamp else _file_sha256(path)
        fresh[rel] = [*stamp, digest]
        total.update(f"{rel}\u0000{digest}\n".encode())
    if not fresh:
        raise ConfigError(f"engine.model: the folder {folder} holds no model files")
    _memo[str(folder)] = dict(fresh)
    if fresh != cached:
        _write_cache(cache_file, fresh)
    return total.hexdigest()


def _model_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of the files that shape outputs, sorted; hidden files and folders left out."""
    out = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or rel.name.lower().startswith(_DOC_PREFIXES):
            continue  # markers and locks (.complete, .locks/), git metadata, documentation
        if rel.suffix.lower() == ".md" or not path.is_file():
            continue
        out.append((rel.as_posix(), path))
    return sorted(out)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_cache(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, entries: dict[str, list[object]]) -> None:
    # Atomic (a temporary file renamed over it): two drivers hashing at once each write a whole file.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as tmp:
            json.dump(entries, tmp, sort_keys=True)
        os.replace(tmp.name, path)
    except OSError as exc:  # a read-only home only costs the next run a re-hash
        log.warning("could not cache model file digests in %s: %s", path, exc)
