"""Model folders qwenspark can make on its own: the pinned Qwen GGUFs on PyPI (the tiny test model is tests/support)."""
