"""Inference engines behind one small protocol; `build_engine` picks one from EngineConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qwenspark.config import EngineConfig
    from qwenspark.engines.base import Engine


def build_engine(cfg: EngineConfig) -> Engine:
    """Construct (load) the engine named by cfg.kind. Imports the heavy library only here."""
    if cfg.kind == "vllm":
        from qwenspark.engines.vllm import VllmEngine

        return VllmEngine(cfg)
    if cfg.kind == "custom":
        import importlib

        module, _, name = str(cfg.factory).partition(":")
        factory = getattr(importlib.import_module(module), name)
        engine: Engine = factory(cfg)
        return engine
    if cfg.kind == "openai":
        from qwenspark.engines.openai import OpenAIEngine

        return OpenAIEngine(cfg)
    from qwenspark.engines.transformers import TransformersEngine

    return TransformersEngine(cfg)
