"""A test engine whose Python worker dies (SIGKILL) on its first call of a test, then answers as the echo engine."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path

from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message
from tests.support.echo_engine import EchoEngine


class DyingEngine(EchoEngine):
    """engine_kwargs die_marker: a file; the first generate() anywhere creates it and kills its own process."""

    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__(cfg)
        self.marker = Path(str(cfg.engine_kwargs["die_marker"]))

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: str | None = None,
    ) -> list[Completion]:
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return super().generate(conversations, langs, retry=retry)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no cleanup, no exception
        raise AssertionError("unreachable")


def build(cfg: EngineConfig) -> DyingEngine:
    """engine.factory entry point."""
    return DyingEngine(cfg)
