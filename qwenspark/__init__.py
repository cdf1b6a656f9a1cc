"""qwenspark: hotel reviews in MySQL -> Spark -> Qwen (vLLM) -> sentiment analytics in MySQL.

Importing the package is cheap and driver-safe: torch, vllm and transformers are only imported
inside executor-side engine code.
"""

__version__ = "0.1.0"
