"""Test support code (not shipped in the wheel): the tiny random Qwen3 model builder."""
