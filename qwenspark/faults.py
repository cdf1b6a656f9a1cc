"""Failpoints: crash the driver at a named point when QWENSPARK_FAILPOINT asks (the kill tests use them)."""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "QWENSPARK_FAILPOINT"


def failpoint(name: str, key: object = None) -> None:
    """SIGKILL this process if $QWENSPARK_FAILPOINT is `name` or `name:key` (a crash: no cleanup runs)."""
    wanted = os.environ.get(ENV)
    if not wanted or wanted not in (name, f"{name}:{key}"):
        return
    log.warning("failpoint %s:%s reached: killing pid %d with SIGKILL", name, key, os.getpid())
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)
