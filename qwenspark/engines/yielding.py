"""The batch's engine standing still while a service on its host answers: the services' busy board and the batch's
duty cycle (engine.yield_to_service).

Each service process with a vLLM engine publishes how many answers it has in flight in a file of its own on the
host's board (a folder in /dev/shm); a batch engine with yield_to_service > 0 reads the board and, while a service
whose devices overlap its own has answers in flight, stands still for that share of every period and runs the rest.
Beside a batch on one GPU the service's steps wait behind the batch's (bench/results/serve_history.md, stops 33-40:
whole answer P99 0.67 s alone, 3.5-4.4 s beside the batch, MPS did not help); the batch gives way in software here,
the one process that can tell when it matters. The batch always runs at least 1 - yield_to_service of the time (at
most 0.95 is given away), so a service that hangs with answers in flight slows the batch but never stops it. The
board is open to the host's users as /tmp is (a service and the executors may run as different users): whoever can
write it can slow a yielding batch by that share, nothing more. Services and batches must share the pid namespace (a
dead service's file is told by its pid) and the folder (a container's mount of /dev/shm, or QWENSPARK_SERVICE_BOARD).
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

# The board's folder: one file per service process, named by its pid. Shared memory where the host has it (nothing
# reaches a disk), else the temporary folder. QWENSPARK_SERVICE_BOARD moves it (tests, a container's mount).
BOARD_ENV = "QWENSPARK_SERVICE_BOARD"
_SIZE = 256  # in flight (8 bytes, little-endian int64), then the process's devices in UTF-8, NUL-padded
_COUNT = struct.Struct("<q")
PERIOD_S = 0.2  # a duty cycle's length: the batch stands still share x 200 ms, then runs (1 - share) x 200 ms
RESCAN_S = 1.0  # how often a reader looks for services that started or stopped
# The longest one hold may last (a long batch step at a high share): the batch always moves on within this.
MAX_HOLD_S = 5.0


def board_dir() -> Path:
    """The host's board (the folder every service's file is in)."""
    chosen = os.environ.get(BOARD_ENV)
    if chosen:
        return Path(chosen)
    shm = Path("/dev/shm")
    return (shm if shm.is_dir() else Path(tempfile.gettempdir())) / "qwenspark-services"


def devices() -> str:
    """The GPUs this process may use as CUDA_VISIBLE_DEVICES names them; empty: all of the host's (and on a CPU)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()


def overlap(mine: str, theirs: str) -> bool:
    """Whether two processes' devices (devices()) can be the same GPU: unset on either side means all of them."""
    if not mine or not theirs:
        return True
    return bool({d.strip() for d in mine.split(",")} & {d.strip() for d in theirs.split(",")})


class Busy:
    """This service process's file on the board: its answers in flight, updated as each starts and ends."""

    def __init__(self, folder: Path | None = None) -> None:
        folder = folder or board_dir()
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # sticky and open to all, as /tmp: services and batches of any user
                folder.chmod(0o1777)
        _remove_dead(folder)
        self._pid = os.getpid()
        self.path = folder / f"{self._pid}.busy"
        page = bytearray(_SIZE)
        name = devices().encode()[: _SIZE - _COUNT.size]
        page[_COUNT.size : _COUNT.size + len(name)] = name
        ready = self.path.with_suffix(".tmp")
        ready.write_bytes(bytes(page))
        ready.chmod(0o644)
        os.replace(ready, self.path)  # readers never see a half-written file
        with open(self.path, "r+b") as f:
            self._map: mmap.mmap | None = mmap.mmap(f.fileno(), _SIZE)
        self.in_flight = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.in_flight += n
            if self._map is not None:
                _COUNT.pack_into(self._map, 0, self.in_flight)

    def close(self) -> None:
        if os.getpid() != self._pid:  # a forked child's exit (atexit runs there too): the file is its parent's
            return
        with self._lock:
            if self._map is not None:
                self._map.close()
                self._map = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class _Published:
    """This process's one Busy and how many of its engines use it."""

    def __init__(self) -> None:
        self.busy: Busy | None = None
        self.users = 0
        self.lock = threading.Lock()


_PROCESS = _Published()


def publish() -> Busy | None:
    """This process's Busy, made by its first engine and shared by the others (serve.engines in one host process);
    None where the board cannot be written (the service runs on, without yielding batches)."""
    with _PROCESS.lock:
        if _PROCESS.busy is None:
            try:
                _PROCESS.busy = Busy()
            except OSError:
                return None
            atexit.register(_PROCESS.busy.close)
        _PROCESS.users += 1
        return _PROCESS.busy


def unpublish() -> None:
    """One engine of this process closed; the last one removes the file."""
    with _PROCESS.lock:
        _PROCESS.users -= 1
        if _PROCESS.users <= 0 and _PROCESS.busy is not None:
            _PROCESS.busy.close()
            _PROCESS.busy, _PROCESS.users = None, 0


def _files(folder: Path) -> Iterator[tuple[Path, bool]]:
    """The board's service files, each with whether its process (the pid it is named by) is alive."""
    for path in folder.glob("*.busy") if folder.is_dir() else ():
        try:
            pid = int(path.stem)
        except ValueError:  # not one of ours
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            yield path, False
            continue
        except PermissionError:  # another user's process: alive
            pass
        yield path, True


def _remove_dead(folder: Path) -> None:
    """Files left by services that died without closing (a kill -9): removed by the next service to start."""
    for path, alive in _files(folder):
        if not alive:
            with contextlib.suppress(OSError):
                path.unlink()


class Board:
    """A batch engine's view of the board: whether a live service on its devices has answers in flight."""

    def __init__(self, folder: Path | None = None, mine: str | None = None) -> None:
        self.folder = folder or board_dir()
        self.mine = devices() if mine is None else mine
        self._maps: dict[Path, mmap.mmap] = {}
        self._scanned = float("-inf")

    def busy(self, now: float) -> bool:
        if now - self._scanned >= RESCAN_S:
            self._rescan()
            self._scanned = now
        return any(_COUNT.unpack_from(m, 0)[0] > 0 for m in self._maps.values())

    def _rescan(self) -> None:
        seen: set[Path] = set()
        for path, alive in _files(self.folder):
            if not alive:
                continue
            seen.add(path)
            if path in self._maps:
                continue
            try:
                with open(path, "rb") as f:
                    page = mmap.mmap(f.fileno(), _SIZE, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # gone meanwhile, or not one of ours
                continue
            theirs = bytes(page[_COUNT.size :]).rstrip(b"\0").decode(errors="replace")
            if overlap(self.mine, theirs):
                self._maps[path] = page
            else:
                page.close()
        for path in set(self._maps) - seen:  # a service stopped (or died): its count no longer holds the batch
            self._maps.pop(path).close()

    def close(self) -> None:
        for page in self._maps.values():
            page.close()
        self._maps.clear()


class Yielding:
    """The batch's duty cycle: while a service is busy, stand still share x PERIOD_S, then run the rest of the
    period; run freely while none is. A service's first answer is not kept waiting: the batch stops when it
    begins. The share counts the batch's steps whole: a step the batch began in its run, or was in when told to stand
    still, ends before the batch stops (a 7B step of 16,384 tokens outlasts a 10 ms run on an H100), so each hold is
    as long as the run before it, overrun included, times share / (1 - share), at most MAX_HOLD_S. Measured on an
    H100 (serve_history.md, stop 42) before this: at 0.95 the batch stood still 12.4 s of a 15 s load."""

    def __init__(self, board: Board, share: float, period: float = PERIOD_S) -> None:
        if not 0.0 < share < 1.0:
            raise ValueError(f"yield share must be in (0, 1), got {share}")
        self.board, self.share, self.period = board, share, period
        self._phase: str | None = None  # None: no service busy; "hold" or "run" while one is
        self._until = 0.0
        self.held_s = 0.0  # how long the batch has stood still, for its log
        self._held_from: float | None = None
        self._ran_from = 0.0  # when the run phase began
        self._ran = 0.0  # how long the run before the current hold lasted

    def hold(self, now: float) -> float:
        """Seconds the batch should stand still from now (0: run)."""
        if not self.board.busy(now):
            self._end_hold(now)
            self._phase = None
            return 0.0
        if self._phase is None:  # the batch ran freely until now: a period's run
            self._start_hold(now, (1.0 - self.share) * self.period)
        elif self._phase == "run" and now >= self._until:  # the run, with the step that outlasted it (in this process)
            self._start_hold(now, now - self._ran_from)
        if self._phase == "hold":
            if now < self._until:
                return self._until - now
            self._end_hold(now)
            self._phase, self._ran_from, self._until = "run", now, now + (1.0 - self.share) * self.period
        return 0.0

    def stopped(self, now: float) -> None:
        """The batch's engine core (a process of its own) stopped only now, the step it was in when told to stand
        still ended: that step counts as the batch's run, and the hold starts now."""
        if self._phase == "hold" and self._held_from is not None and now > self._held_from:
            self._start_hold(now, self._ran + (now - self._held_from))

    def _start_hold(self, now: float, ran: float) -> None:
        self._phase, self._held_from, self._ran = "hold", now, ran
        self._until = now + min(ran * self.share / (1.0 - self.share), MAX_HOLD_S)

    def _end_hold(self, now: float) -> None:
        if self._held_from is not None:  # a hold ends at its end at the latest, however late it is looked at
            self.held_s += min(now, self._until) - self._held_from
            self._held_from = None


def yielding(share: float) -> Yielding | None:
    """The duty cycle for engine.yield_to_service (None at 0: the batch never looks at the board)."""
    return Yielding(Board(), share) if share > 0 else None
