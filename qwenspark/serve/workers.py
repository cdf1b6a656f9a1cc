"""Several service processes on one port (serve.workers), the kernel spreading connections over them (SO_REUSEPORT),
stopped together: with engine.kind vllm all share one engine hosted here (qwenspark.serve.shared); other engines are
loaded in each process, one process at a time."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
from contextlib import suppress
from multiprocessing.connection import wait
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from qwenspark.config import EngineConfig, QwenSparkConfig
from qwenspark.errors import EngineError
from qwenspark.resources import share_cores, share_gpu_memory

log = logging.getLogger("qwenspark.serve")


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other processes may bind too (each gets a share of the connections)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def _worker(cfg: QwenSparkConfig, host: str, port: int, *, index: int, ready: Event, level: int,
            engine_path: Path | None) -> None:
    from qwenspark.serve.app import serve_one

    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s %(name)s[{index}]: %(message)s")
    serve_one(cfg, host, port, sock=listening_socket(host, port), worker=index, ready=ready.set,
              engine_path=engine_path)


class EngineHost:
    """The shared engine (count of them: serve.engines) and its socket (qwenspark.serve.shared.Host), on an event loop
    of their own in a thread of the supervisor; `gone` becomes readable when that thread ends."""

    def __init__(self, cfg: EngineConfig, count: int = 1) -> None:
        self.cfg, self.count = cfg, count
        self._dir = Path(tempfile.mkdtemp(prefix="qwenspark-engine-"))  # 0700: only this user reaches the socket
        self.path = self._dir / "engine.sock"
        self._loaded = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self.gone, self._alive = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="qwenspark-engine-host", daemon=True)

    def start(self) -> Path:
        """Load the engine and listen; the socket's path once both are done."""
        self._thread.start()
        self._loaded.wait()
        if self._error is not None or not self._thread.is_alive():
            raise EngineError(f"serve: the shared engine did not start: {self._error!r}")
        return self.path

    def _run(self) -> None:
        try:
            from qwenspark.serve.app import loop_factory

            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                runner.run(self._main())
        except BaseException as exc:  # reported by start(), or once serving by the supervisor (`gone`)
            self._error = exc
            log.exception("serve: the shared engine's host stopped")
        finally:
            self._loaded.set()
            self._alive.close()

    async def _main(self) -> None:
        from qwenspark.engines.vllm import apply_env, on_gpu
        from qwenspark.serve.engine import AsyncVllm
        from qwenspark.serve.pauses import freeze_heap
        from qwenspark.serve.shared import Host

        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        engines: list[AsyncVllm] = []
        try:
            # One after another, as the workers' own engines load: vLLM sizes an engine's memory from what it finds
            # free on the GPU. Each start blocks this loop while it loads: a stop waits for the load.
            apply_env(self.cfg)  # before torch looks for a GPU (engine.env may hide one)
            gpu = on_gpu()
            for share in share_cores(self.cfg, self.count, list(os.sched_getaffinity(0)), gpu=gpu):
                if self._stopping.is_set():
                    break
                cfg = share_gpu_memory(share, self.count) if gpu else share
                if gpu:
                    log.info("serve: engine %d of %d, %s of the GPU's memory", len(engines) + 1, self.count,
                             cfg.gpu_memory_utilization or "vLLM's default share")
                elif cfg is not self.cfg:  # a CPU's share
                    log.info("serve: engine %d of %d, its threads on cores %s", len(engines) + 1, self.count,
                             cfg.env.get("VLLM_CPU_OMP_THREADS_BIND"))
                engines.append(await AsyncVllm.start(cfg))
            if self._stopping.is_set():  # stopped while loading
                return
            host = Host(engines, self.path)
            await host.start()
            freeze_heap()
            log.info("serve: %d engine%s for all workers (%s), on %s", len(engines), "s" if len(engines) > 1 else "",
                     engines[0].model_name, self.path)
            self._loaded.set()
            while not self._stopping.is_set():
                if not host.alive():  # an engine core died: the workers are stopped, the service ends red
                    raise EngineError("serve: the shared engine died")
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), 1.0)
            log.info("serve: the shared engine handed %d requests to vLLM", host.served)
            await host.stop()
        finally:
            for engine in engines:
                await engine.close()

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(120)
        shutil.rmtree(self._dir, ignore_errors=True)


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the supervisor's finally stops the workers


def supervise(cfg: QwenSparkConfig, host: str, port: int) -> None:
    """Start serve.workers service processes (with engine.kind vllm, after the serve.engines engines they share: both
    counts as app.serve resolved them, never 0 here; other engines in each process, each process once the one before
    it is serving: vLLM sizes an engine's memory from what it finds free on the GPU, so two loading at once would both
    count the same memory); serve until interrupted; if a worker or the shared engine's host ends, stop the rest and
    fail (an outage ends red)."""
    from qwenspark.serve.app import serve_engine_config

    context = multiprocessing.get_context("spawn")  # a forked CUDA context is unusable
    workers: list[Any] = []
    shared = EngineHost(serve_engine_config(cfg), cfg.serve.engines) if cfg.engine.kind == "vllm" else None
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        engine_path = shared.start() if shared is not None else None
        starting: list[tuple[int, Any, Event]] = []
        for index in range(cfg.serve.workers):
            ready = context.Event()
            proc = context.Process(target=_worker, name=f"qwenspark-serve-{index}", args=(cfg, host, port),
                                   kwargs={"index": index, "ready": ready, "level": logging.getLogger().level,
                                           "engine_path": engine_path})
            proc.start()
            workers.append(proc)
            if shared is None:  # each loads an engine: one at a time
                _wait_ready(index, proc, ready)
            else:  # the engine is loaded: all start at once
                starting.append((index, proc, ready))
        for index, proc, ready in starting:
            _wait_ready(index, proc, ready)
        log.info("%d workers serving on http://%s:%d", len(workers), host, port)
        ended = wait([proc.sentinel for proc in workers] + ([shared.gone] if shared is not None else []))
        if shared is not None and shared.gone in ended:
            raise EngineError("serve: the shared engine's host stopped; the workers are stopped")
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
        if shared is not None:
            shared.stop()
        signal.signal(signal.SIGTERM, previous)


def _wait_ready(index: int, proc: Any, ready: Event) -> None:
    while not ready.wait(0.5):
        if not proc.is_alive():
            raise EngineError(f"serve worker {index} exited (rc {proc.exitcode}) before it was serving")
