"""Failpoints: act at a named point when QWENSPARK_FAILPOINT asks (the kill and outage tests use them)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess

log = logging.getLogger(__name__)

ENV = "QWENSPARK_FAILPOINT"
# Optional: a shell command run at the failpoint instead of killing this process (e.g. `kill -9 <db pid>`);
# the process then goes on, and meets whatever the command broke.
EXEC_ENV = "QWENSPARK_FAILPOINT_EXEC"


def failpoint(name: str, key: object = None) -> None:
    """If $QWENSPARK_FAILPOINT is `name` or `name:key`: run $QWENSPARK_FAILPOINT_EXEC, else SIGKILL this process."""
    wanted = os.environ.get(ENV)
    if not wanted or wanted not in (name, f"{name}:{key}"):
        return
    command = os.environ.get(EXEC_ENV)
    if command:
        log.warning("failpoint %s:%s reached: running %s", name, key, command)
        subprocess.run(command, shell=True, check=False)
        return
    log.warning("failpoint %s:%s reached: killing pid %d with SIGKILL", name, key, os.getpid())
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)
