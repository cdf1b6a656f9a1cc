"""Model folders qwenspark can make on its own: the pinned default Qwen and a tiny random Qwen for tests."""
