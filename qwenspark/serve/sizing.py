"""How many service processes and vLLM engines `qwenspark serve` starts where serve.workers / serve.engines say 0."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qwenspark.config import QwenSparkConfig

log = logging.getLogger("qwenspark.serve")

# Service processes for serve.workers 0 on a GPU. On an H200 one process was the bound once the engine ran full CUDA
# graphs (0.99 of a core, the 0.6B saturated at 163 of 200 requests/s); with 3 the engine core was (193/s, each
# worker 0.2-0.4 of a core): serve_history.md, stop 33. Fewer than 8 cores leave the engine core none to spare.
GPU_WORKERS, GPU_WORKERS_MIN_CORES = 3, 8

# Engines for serve.engines 0 on a GPU with a small model. Its engine core (one Python thread: the scheduler, the
# grammar's masks, the step's inputs) bounds a small model's answers while the GPU idles, so a second engine doubles
# that CPU: the 0.6B at 200 guided requests/s, whole answer P99, two engines against one: 0.42-0.59 s against
# 1.14-1.21 s (H200, stop 38), 0.54 against 0.63 s (H100, stop 40), 0.62 s against falling behind at 155 answers/s
# on a slow host (H100, stop 50); 0.39 against 0.34-0.35 s on a fast one (stop 43). A large model's step is the GPU's:
# two engines only time-slice it (stop 29), so one.
SMALL_ENGINES, SMALL_MODEL_PARAMS = 2, 1.0e9  # the 0.5B and 0.6B classes; measured on the 0.6B


def worker_count(cfg: QwenSparkConfig) -> int:
    """serve.workers, or for 0 the default for where the service runs (GPU_WORKERS with vLLM on a GPU, else 1)."""
    if cfg.serve.workers:
        return cfg.serve.workers
    if not _vllm_with_cores(cfg):
        return 1
    from qwenspark.engines.vllm import on_gpu

    workers = GPU_WORKERS if on_gpu() else 1
    log.info("serve: %d service process%s (serve.workers 0: %s)", workers, "es" if workers > 1 else "",
             "vLLM on a GPU" if workers > 1 else "no GPU")
    return workers


def engine_count(cfg: QwenSparkConfig) -> int:
    """serve.engines, or for 0: SMALL_ENGINES with vLLM on a GPU, 8 cores or more, and a model of at most
    SMALL_MODEL_PARAMS parameters (from its folder's config.json); else 1."""
    if cfg.serve.engines:
        return cfg.serve.engines
    if not _vllm_with_cores(cfg):
        return 1
    params = model_parameters(Path(cfg.engine.model))
    if params is None or params > SMALL_MODEL_PARAMS:
        return 1
    from qwenspark.engines.vllm import on_gpu

    if not on_gpu():
        return 1
    log.info("serve: %d engines (serve.engines 0: vLLM on a GPU, a model of %.2fB parameters)", SMALL_ENGINES,
             params / 1e9)
    return SMALL_ENGINES


def _vllm_with_cores(cfg: QwenSparkConfig) -> bool:
    """Whether the service runs vLLM with GPU_WORKERS_MIN_CORES or more cores: the engine core needs cores to spare.
    The cores this process may run on (taskset, a container's cpuset), not the host's."""
    return cfg.engine.kind == "vllm" and len(os.sched_getaffinity(0)) >= GPU_WORKERS_MIN_CORES


def layer_parameters(shape: Mapping[str, Any]) -> int:
    """The parameters of a dense decoder's layers (attention's q, k, v and o, the MLP's three projections), from its
    config.json's keys; bench/workload_100k.py's costs take them too."""
    h, heads = int(shape["hidden_size"]), int(shape["num_attention_heads"])
    kv, hd = int(shape.get("num_key_value_heads") or heads), int(shape.get("head_dim") or h // heads)
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * int(shape["intermediate_size"])
    return int(shape["num_hidden_layers"]) * per_layer


def model_parameters(folder: Path) -> float | None:
    """About how many parameters a dense decoder's config.json in folder describes (its layers' projections and the
    embedding); None where there is no such file, or it describes something else (experts, unknown keys)."""
    try:
        shape = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        shape = shape.get("text_config", shape)  # a multimodal model's language part
        if any(key in shape for key in ("num_experts", "num_local_experts", "n_routed_experts")):
            return None  # a mixture of experts: its size and its step are not a dense model's
        layers = layer_parameters(shape)
        copies = 1 if shape.get("tie_word_embeddings") else 2  # the embedding, and the LM head where not tied
        embeddings = int(shape["vocab_size"]) * int(shape["hidden_size"]) * copies
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return None
    return float(layers + embeddings)
