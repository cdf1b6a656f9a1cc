"""Plain transformers engine (for machines with no vLLM build): batched generate + xgrammar guided JSON."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message, Retry, attempt_settings, resolve_dtype
from qwenspark.errors import EngineError
from qwenspark.parse import answer_grammars


def _device(torch: Any, cfg: EngineConfig) -> str:
    """cuda when engine.device asks for it (and fails loudly without a GPU) or, for auto, when one is visible."""
    if cfg.device == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if cfg.device == "cuda":
        raise EngineError("engine.device=cuda but torch sees no GPU in this worker (CUDA_VISIBLE_DEVICES, drivers?)")
    return "cpu"


class TransformersEngine:
    """AutoModelForCausalLM loaded once; generate() runs one left-padded batch, greedy unless temperature>0."""

    def __init__(self, cfg: EngineConfig) -> None:
        os.environ.update(cfg.env)
        try:
            import torch
            import xgrammar
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise EngineError("engine.kind=transformers needs the `hf` extra (transformers, torch, xgrammar)") from exc
        self._torch = torch
        self.model_name = cfg.model
        self._cfg = cfg
        self._tok = AutoTokenizer.from_pretrained(cfg.tokenizer or cfg.model)
        # Left padding so that every row's new tokens start at the same position.
        self._tok.padding_side = "left"
        if self._tok.pad_token_id is None:
            self._tok.pad_token = self._tok.eos_token
        kwargs = dict(cfg.engine_kwargs)
        device = _device(torch, cfg)
        if device == "cuda" and "device_map" not in kwargs:
            # The task's GPUs are the only visible ones (CUDA_VISIBLE_DEVICES pinned before torch loaded): cuda:0
            # is the task's first GPU; a task holding several spreads the layers over them.
            kwargs["device_map"] = "auto" if (cfg.tensor_parallel_size or 1) > 1 else "cuda:0"
        dtype = getattr(torch, resolve_dtype(cfg.dtype, device == "cuda"))
        self._model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype, **kwargs).eval()
        gen_eos = self._model.generation_config.eos_token_id
        eos = gen_eos if isinstance(gen_eos, list) else [gen_eos, self._tok.eos_token_id]
        self._eos = {int(e) for e in eos if e is not None}
        self._grammars: dict[str | None, Any] = {}  # by review language (engine.summary_script), None: any
        if cfg.guided:
            info = xgrammar.TokenizerInfo.from_huggingface(
                self._tok, vocab_size=self._model.config.vocab_size, stop_token_ids=sorted(self._eos)
            )
            compiler = xgrammar.GrammarCompiler(info)
            self._grammars = {
                lang: compiler.compile_json_schema(grammar["json"], any_whitespace=False) if "json" in grammar
                else compiler.compile_grammar(grammar["grammar"])
                for lang, grammar in answer_grammars(cfg).items()
            }

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: Retry | None = None,
    ) -> list[Completion]:
        import xgrammar.contrib.hf as xgr_hf

        torch = self._torch
        prompts = [
            self._tok.apply_chat_template(list(c), tokenize=False, add_generation_prompt=True) for c in conversations
        ]
        enc = self._tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self._model.device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": self._cfg.max_tokens,
            "pad_token_id": self._tok.pad_token_id,
            "do_sample": self._cfg.temperature > 0,
        }
        if self._cfg.temperature > 0:
            kwargs["temperature"] = self._cfg.temperature
            torch.manual_seed(self._cfg.seed)
        processors: list[Any] = []
        cfg = self._cfg
        guided, penalty = attempt_settings(cfg.optimistic, cfg.frequency_penalty, cfg.repair_penalty, retry)
        if penalty:
            processors.append(_FrequencyPenalty(penalty, enc["input_ids"].shape[1]))
        if self._grammars and guided:
            # The processor keeps one matcher per row and is single-use: a new one per call.
            grammars = [self._grammars.get(None if langs is None else langs[j], self._grammars[None])
                        for j in range(len(prompts))]
            processors.append(xgr_hf.LogitsProcessor(grammars))
        if processors:
            kwargs["logits_processor"] = processors
        with torch.inference_mode():
            out = self._model.generate(**enc, **kwargs)
        width = enc["input_ids"].shape[1]
        results = []
        for row, mask in zip(out[:, width:].tolist(), enc["attention_mask"].tolist(), strict=True):
            new: list[int] = []
            finish = "length"
            for tok in row:
                if tok in self._eos:
                    finish = "stop"
                    break
                new.append(tok)
            results.append(
                Completion(
                    text=self.decode(new),
                    finish_reason=finish,
                    tokens_in=int(sum(mask)),
                    tokens_out=len(new) + (1 if finish == "stop" else 0),
                )
            )
        return results

    def close(self) -> None:
        self.__dict__.pop("_model", None)
        import gc

        gc.collect()


class _FrequencyPenalty:
    """vLLM's and OpenAI's frequency penalty for transformers: each logit minus penalty x the times the answer so far
    holds that token (the prompt does not count)."""

    def __init__(self, penalty: float, prompt_width: int) -> None:
        self.penalty, self.width = penalty, prompt_width

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        generated = input_ids[:, self.width :]
        if generated.shape[1] == 0:
            return scores
        counts = scores.new_zeros(scores.shape).scatter_add_(1, generated, scores.new_ones(generated.shape))
        return scores - self.penalty * counts
