"""Several service processes on one port (serve.workers): each with its own engine, the kernel spreading connections
over them (SO_REUSEPORT), started one at a time and stopped together."""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
from multiprocessing.connection import wait
from multiprocessing.synchronize import Event
from typing import Any

from qwenspark.config import QwenSparkConfig
from qwenspark.errors import EngineError

log = logging.getLogger("qwenspark.serve")


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other processes may bind too (each gets a share of the connections)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def _worker(cfg: QwenSparkConfig, host: str, port: int, *, index: int, ready: Event, level: int) -> None:
    from qwenspark.serve.app import serve_one

    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s %(name)s[{index}]: %(message)s")
    serve_one(cfg, host, port, sock=listening_socket(host, port), worker=index, ready=ready.set)


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the supervisor's finally stops the workers


def supervise(cfg: QwenSparkConfig, host: str, port: int) -> None:
    """Start serve.workers service processes, each once the one before it is serving (vLLM sizes an engine's memory
    from what it finds free on the GPU, so two loading at once would both count the same memory); serve until
    interrupted; if one worker exits, stop the others and fail (an outage ends red)."""
    context = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable
    workers: list[Any] = []
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for index in range(cfg.serve.workers):
            ready = context.Event()
            proc = context.Process(target=_worker, name=f"qwenspark-serve-{index}", args=(cfg, host, port),
                                   kwargs={"index": index, "ready": ready, "level": logging.getLogger().level})
            proc.start()
            workers.append(proc)
            while not ready.wait(0.5):
                if not proc.is_alive():
                    raise EngineError(f"serve worker {index} exited (rc {proc.exitcode}) before it was serving")
        log.info("%d workers serving on http://%s:%d", len(workers), host, port)
        wait([proc.sentinel for proc in workers])
        gone = next(proc for proc in workers if not proc.is_alive())
        raise EngineError(f"serve: {gone.name} exited (rc {gone.exitcode}); the others are stopped")
    except KeyboardInterrupt:
        log.info("serve: stopping %d workers", len(workers))
    finally:
        for proc in workers:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn finishes the requests in flight and closes the engine
        for proc in workers:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
        signal.signal(signal.SIGTERM, previous)
