"""Model folders qwenspark can make on its own: the pinned default Qwen (the tiny test model is tests/support)."""
