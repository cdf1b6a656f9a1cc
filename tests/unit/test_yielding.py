"""engine.yield_to_service: a service's answers in flight reach a batch in another process through the board, and the
batch's duty cycle stands still while they do."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from qwenspark.engines import yielding as y
from qwenspark.engines.vllm_feeds import InProcess, give_way

ROOT = Path(__file__).resolve().parents[2]

# A service process: publishes on the board, takes counts on stdin ("+2", "-1"), says "ok" after each.
SERVICE = r"""
import os, sys
from qwenspark.engines.yielding import publish
busy = publish()
print("ok", flush=True)
for line in sys.stdin:
    if line.strip() == "fork":  # a child that exits as Python does, running the atexit handlers it inherited
        child = os.fork()
        if child == 0:
            sys.exit(0)
        os.waitpid(child, 0)
    else:
        busy.add(int(line))
    print("ok", flush=True)
"""


def _service(board: Path, devices: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, y.BOARD_ENV: str(board), "CUDA_VISIBLE_DEVICES": devices, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SERVICE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ok"
    return proc


def _say(proc: subprocess.Popen[str], change: int | str) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{change:+d}\n" if isinstance(change, int) else f"{change}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "ok"


def test_a_services_answers_in_flight_reach_a_batch_in_another_process(tmp_path: Path) -> None:
    service = _service(tmp_path)
    try:
        board = y.Board(tmp_path, mine="")
        files = list(tmp_path.glob("*.busy"))
        assert [f.name for f in files] == [f"{service.pid}.busy"]
        assert not board.busy(0.0), "published, nothing in flight"
        _say(service, "fork")
        assert [f.name for f in tmp_path.glob("*.busy")] == [f"{service.pid}.busy"], "a forked child left it alone"
        _say(service, +2)
        assert board.busy(0.1), "read from the mapped file, without a rescan"
        _say(service, -1)
        assert board.busy(0.2)
        _say(service, -1)
        assert not board.busy(0.3)
        _say(service, +1)
        assert board.busy(0.4)
        service.send_signal(signal.SIGKILL)  # dies with an answer in flight, its file left behind
        service.wait()
        assert (tmp_path / f"{service.pid}.busy").exists()
        assert board.busy(0.5), "until the next rescan"
        assert not board.busy(0.5 + y.RESCAN_S), "a dead service holds no batch"
        board.close()
        fresh = _service(tmp_path)  # the next service to start removes what the dead one left
        try:
            assert sorted(f.name for f in tmp_path.glob("*.busy")) == [f"{fresh.pid}.busy"]
        finally:
            fresh.stdin.close()  # type: ignore[union-attr]
            fresh.wait(timeout=30)
        assert not list(tmp_path.glob("*.busy")), "a service that ends removes its file"
    finally:
        service.kill()


def test_a_batch_gives_way_only_to_a_service_on_its_own_gpus(tmp_path: Path) -> None:
    service = _service(tmp_path, devices="2,3")
    try:
        _say(service, +1)
        assert y.Board(tmp_path, mine="3").busy(0.0)
        assert y.Board(tmp_path, mine="0,1").busy(0.0) is False
        assert y.Board(tmp_path, mine="").busy(0.0), "a batch on all of the host's GPUs shares the service's"
    finally:
        service.kill()
        service.wait()
    assert y.overlap("0", "") and y.overlap("", "1") and y.overlap("0, 1", "1") and not y.overlap("0", "1")


class Switch:
    """A board whose service is busy while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.mine = ""
        self.folder = Path("/nowhere")

    def busy(self, now: float) -> bool:
        return self.on

    def close(self) -> None:
        pass


def test_the_duty_cycle_holds_its_share_of_each_period_while_a_service_is_busy() -> None:
    board = Switch()
    cycle = y.Yielding(board, 0.75, period=0.2)  # type: ignore[arg-type]
    assert cycle.hold(0.0) == 0.0, "no service busy: run"
    board.on = True
    assert cycle.hold(1.0) == pytest.approx(0.15), "a service's first answer stops the batch at once"
    assert cycle.hold(1.1) == pytest.approx(0.05)
    assert cycle.hold(1.15) == 0.0, "then it runs the rest of the period"
    assert cycle.hold(1.19) == 0.0
    assert cycle.hold(1.2) == pytest.approx(0.15), "and stands still again"
    # stepped every millisecond through 10 s of a busy service: 75 % of the time held
    held = sum(cycle.hold(2.0 + i / 1000) > 0 for i in range(10_000))
    assert held / 10_000 == pytest.approx(0.75, abs=0.01)
    board.on = False
    assert cycle.hold(12.05) == 0.0, "the service idle: run at once"
    assert cycle.held_s == pytest.approx(0.15 + 0.15 + 7.5, abs=0.2)
    for share in (0.0, 1.0):
        with pytest.raises(ValueError, match="yield share"):
            y.Yielding(board, share)  # type: ignore[arg-type]


def test_a_step_that_outlasts_its_run_lengthens_the_next_hold_to_keep_the_share() -> None:
    board = Switch()
    board.on = True
    cycle = y.Yielding(board, 0.75, period=0.2)  # type: ignore[arg-type]
    assert cycle.hold(1.0) == pytest.approx(0.15)
    assert cycle.hold(1.15) == 0.0  # runs from 1.15 for 50 ms
    # In this process: the step begun at 1.15 returns at 1.45, 250 ms past its run: the batch ran 300 ms, and
    # stands still three times as long.
    assert cycle.hold(1.45) == pytest.approx(0.9)
    assert cycle.hold(2.35) == 0.0
    # An engine core of its own: told to stand still at 2.4, it stopped at 2.6 (vLLM's pause returned then); its
    # run was 50 + 200 ms.
    assert cycle.hold(2.4) == pytest.approx(0.15)
    cycle.stopped(2.6)
    assert cycle.hold(2.6) == pytest.approx(0.75)
    assert cycle.hold(3.35) == 0.0
    held = cycle.held_s
    cycle.stopped(3.37)  # running: nothing to lengthen
    assert cycle.hold(3.38) == 0.0 and cycle.held_s == held
    assert held == pytest.approx(0.15 + 0.9 + 0.75), "the time the batch stood still, not the steps it finished"
    # However long a step, one hold ends within MAX_HOLD_S.
    greedy = y.Yielding(board, 0.95, period=0.2)  # type: ignore[arg-type]
    assert greedy.hold(10.0) == pytest.approx(0.19)
    greedy.stopped(12.0)
    assert greedy.hold(12.0) == pytest.approx(y.MAX_HOLD_S)


def test_an_in_process_engine_takes_no_step_while_held() -> None:
    steps: list[float] = []

    class Engine:
        def step(self) -> list[Any]:
            steps.append(time.monotonic())
            return []

    board = Switch()
    feed = object.__new__(InProcess)
    feed._engine, feed._yielding = Engine(), y.Yielding(board, 0.9, period=0.2)  # type: ignore[arg-type]
    feed.finished()
    assert len(steps) == 1
    board.on = True
    started = time.monotonic()
    while time.monotonic() - started < 0.15:
        assert feed.finished() == []
    assert len(steps) == 1, "the batch stood still while the service answered"
    while time.monotonic() - started < 0.25:
        feed.finished()
    assert len(steps) > 1, "and ran again after its share of the period"


def test_an_engine_core_of_its_own_is_paused_and_resumed_by_vllms_api() -> None:
    calls: list[str] = []

    class Llm:
        async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
            calls.append(f"pause {mode} {clear_cache}")

        async def resume_generation(self) -> None:
            calls.append("resume")

    class Script:
        """Busy for the first 30 ms of the run, then idle."""

        def __init__(self) -> None:
            self.start = time.monotonic()

        def hold(self, now: float) -> float:
            return max(0.0, 0.03 - (now - self.start))

        def stopped(self, now: float) -> None:
            calls.append("stopped")

    async def run() -> None:
        task = asyncio.create_task(give_way(Llm(), Script()))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    # every request and its cache kept; the hold counted from the pause's return
    assert calls == ["pause keep False", "stopped", "resume"]
