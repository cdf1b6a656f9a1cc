"""qwenspark: hotel reviews in MySQL -> Spark -> Qwen (vLLM) -> sentiment analytics in MySQL.

Importing the package is cheap and driver-safe: torch, vllm and transformers are only imported
inside executor-side engine code.
"""

__version__ = "0.1.0"

from typing import Any

# The public Spark API (qwenspark.api), imported on first use: `import qwenspark` stays cheap (no Spark, no pandas).
_API = ("ANALYSIS_SCHEMA", "AnalysisFailed", "analyze_reviews", "qwen_analyze", "register", "resolve_config")
__all__ = [
    "ANALYSIS_SCHEMA", "AnalysisFailed", "__version__", "analyze_reviews", "qwen_analyze", "register", "resolve_config"
]


def __getattr__(name: str) -> Any:
    if name in _API:
        from qwenspark import api

        return getattr(api, name)
    raise AttributeError(f"module 'qwenspark' has no attribute {name!r}")
