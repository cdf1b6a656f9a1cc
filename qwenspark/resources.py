"""GPU discovery and pinning for a task (executor side); checks of spark.*.resource.gpu.* (driver side)."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from qwenspark.config import EngineConfig, QwenSparkConfig
from qwenspark.errors import ConfigError, EngineError

log = logging.getLogger(__name__)

EXECUTOR_GPU_AMOUNT = "spark.executor.resource.gpu.amount"
TASK_GPU_AMOUNT = "spark.task.resource.gpu.amount"
WORKER_REUSE = "spark.python.worker.reuse"

# Engines that load the model inside the Python worker: each one owns the GPUs its task was given.
# (An engine that calls a server, e.g. kind=openai, holds no GPU in the executor.)
IN_PROCESS_KINDS = frozenset({"vllm", "transformers", "custom"})


# CUDA_VISIBLE_DEVICES as this Python worker inherited it (a container runtime or YARN isolating the GPUs), read
# before the first task overwrites it. Spark's addresses then index into this list (spark-rapids-ml's rule).
_INHERITED_VISIBLE = os.environ.get("CUDA_VISIBLE_DEVICES")
# Host-wide claims (lock files) this process holds: GPUs in local mode, CPU cores of the engine. Held for the
# life of the process, released by the kernel when it exits, so two engines on one host never share them.
_CLAIMS: dict[str, Any] = {}
_BINDINGS: dict[int, list[int]] = {}  # cores asked -> cores bound (empty: unbound), decided once per process


def claims_dir() -> Path:
    """Folder of the host-wide claim files (QWENSPARK_CLAIMS_DIR, else a folder in the system temp dir)."""
    folder = Path(os.environ.get("QWENSPARK_CLAIMS_DIR") or Path(tempfile.gettempdir()) / "qwenspark-claims")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _try_claim(name: str) -> bool:
    """Take the host-wide claim `name` for this process (True), or find it held by another process (False)."""
    if name in _CLAIMS:
        return True
    handle = (claims_dir() / f"{name}.lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    _CLAIMS[name] = handle
    return True


def claimed(prefix: str) -> list[str]:
    """The claims of this process whose names start with prefix, without it, in claim order."""
    return [name[len(prefix) :] for name in _CLAIMS if name.startswith(prefix)]


def claim_local_gpus(count: int, total: int | None) -> list[str]:
    """Local mode: `count` GPUs of this host that no other engine holds, kept for the life of this process."""
    mine = claimed("gpu-")
    if len(mine) >= count:
        return mine[:count]
    for index in range(total or count):
        if len(mine) >= count:
            break
        if _try_claim(f"gpu-{index}"):
            mine.append(str(index))
    if len(mine) < count:
        raise EngineError(
            f"local mode: only {len(mine)} of the {count} GPU(s) this engine needs are free on this host "
            f"({total or 'unknown'} in all; others are held by engines of other Python workers): lower job.slots, "
            f"or run on a cluster with spark.executor.resource.gpu.amount"
        )
    return mine


def claim_cores(count: int) -> list[int]:
    """Up to `count` CPU cores of this process's affinity that no other engine on this host holds."""
    mine = [int(c) for c in claimed("core-")]
    for core in sorted(os.sched_getaffinity(0)):
        if len(mine) >= count:
            break
        if core not in mine and _try_claim(f"core-{core}"):
            mine.append(core)
    return mine[:count]


def task_gpu_addresses(device: str = "auto") -> list[str]:
    """GPU addresses this task may use, as Spark (or the environment) names them; first answer wins.

    1. The task's Spark resources, `TaskContext.resources()["gpu"]` (standalone, YARN, Kubernetes: the inference
       stage's ResourceProfile or spark.task.resource.gpu.amount; the addresses are what discovery printed).
    2. CUDA_VISIBLE_DEVICES inherited by the worker (a scheduler outside Spark isolated the GPUs).
    3. Only for device="cuda" in local mode (Spark offers tasks no resources there): GPUs of this host claimed
       through lock files, so that two engines never share one GPU.

    device="cpu": none, whatever Spark assigned.
    """
    if device == "cpu":
        return []
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None:
        gpu = ctx.resources().get("gpu")
        if gpu is not None and gpu.addresses:
            return [str(a).strip() for a in gpu.addresses]
    if _INHERITED_VISIBLE and _INHERITED_VISIBLE.strip():
        return [a.strip() for a in _INHERITED_VISIBLE.split(",") if a.strip()]
    if device == "cuda" and ctx is not None:
        return claim_local_gpus(1, visible_gpu_count())
    return []


def visible_devices(addresses: list[str], inherited: str | None) -> list[str]:
    """CUDA_VISIBLE_DEVICES entries for Spark's GPU addresses.

    Without an inherited CUDA_VISIBLE_DEVICES the addresses are the host's indices and are used as they are.
    With one (the cluster manager isolated the GPUs and the discovery script ran inside that view), an address
    is an index into the inherited list, as spark-rapids-ml reads it; an address that is no valid index but
    names an entry of the list is taken as that entry. Anything else is refused: never the wrong device.
    """
    listed = [a.strip() for a in (inherited or "").split(",") if a.strip()]
    if not listed or addresses == listed:
        return list(addresses)
    out = []
    for address in addresses:
        if address.isdigit() and int(address) < len(listed):
            out.append(listed[int(address)])
        elif address in listed:
            out.append(address)
        else:
            raise EngineError(
                f"GPU address {address} from Spark is neither an index into nor an entry of the inherited "
                f"CUDA_VISIBLE_DEVICES={inherited}: fix the discovery script or the cluster manager's GPU isolation"
            )
    return out


def visible_gpu_count() -> int | None:
    """How many GPUs nvidia-smi lists on this host (None: no nvidia-smi, or it failed)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return None
    return sum(1 for line in out.stdout.splitlines() if line.strip()) or None


def pin_task_gpus(cfg: EngineConfig) -> tuple[EngineConfig, list[str]]:
    """Set CUDA_VISIBLE_DEVICES to the task's GPUs before torch/vllm load; size tensor parallelism to them.

    Returns the engine config and the device list the engine runs on (CUDA_VISIBLE_DEVICES entries; part of the
    engine cache key). Must run before anything in the worker initialises CUDA: CUDA reads the variable once.
    device="cpu" hides every GPU from the engine.
    """
    addresses = task_gpu_addresses(cfg.device)
    devices = visible_devices(addresses, _INHERITED_VISIBLE) if addresses else []
    if cfg.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif devices:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if cfg.tensor_parallel_size is None:
        cfg = cfg.model_copy(update={"tensor_parallel_size": max(len(devices), 1)})
    return cfg, devices


def pin_threads(cfg: EngineConfig, cores: int, gpus: Sequence[str] = ()) -> tuple[EngineConfig, list[int]]:
    """Give the engine `cores` threads, bound to cores no other engine on this host holds (CPU vLLM).

    Spark sets OMP_NUM_THREADS to spark.task.cpus (1 by default) in every Python worker, which leaves a CPU
    engine on one thread. The values go into the engine's env (set before torch/vllm are imported); what the
    user put in engine.env wins. An engine on GPUs (the task's, gpus, or engine.device cuda) is left as it is: its
    threads only feed the GPU (engines.vllm.GPU_ENV decides them).
    """
    if gpus or cfg.device == "cuda":
        return cfg, []
    env = dict(cfg.env)
    bound: list[int] = []
    if cfg.kind == "vllm" and "VLLM_CPU_OMP_THREADS_BIND" not in env:
        # Decided once per process: the values go into the engine's cache key, so a later task deciding
        # otherwise (cores freed or taken meanwhile) would reload the engine.
        if cores not in _BINDINGS:
            _BINDINGS[cores] = _bind_cores(cores)
        bound = _BINDINGS[cores]
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in bound) if bound else "nobind"
    env.setdefault("OMP_NUM_THREADS", str(cores))
    return cfg.model_copy(update={"env": env}), bound


def _bind_cores(cores: int) -> list[int]:
    """`cores` free cores claimed for good, or none (claims given back) when fewer are free."""
    before = set(claimed("core-"))
    got = claim_cores(cores)
    if len(got) == cores:
        return got
    # Fewer free cores than asked: never pin onto cores another engine uses; leave the threads unbound and give
    # back what was claimed, so that another engine can have it.
    log.warning("only %d of %d cores are free on this host: engine threads left unbound", len(got), cores)
    for core in got:
        if str(core) in before:  # held for an earlier decision of this process
            continue
        handle = _CLAIMS.pop(f"core-{core}", None)
        if handle is not None:
            handle.close()
    return []


def share_cores(cfg: EngineConfig, count: int, cores: Sequence[int], gpu: bool = False) -> list[EngineConfig]:
    """cfg for each of `count` vLLM engines of one process (serve.engines), each given cores of its own on a CPU.

    vLLM's automatic binding puts every engine of a host on the same cores (one NUMA node less a core kept for the
    engine core's scheduler), and each engine's OpenMP pool is as large as the host: two engines' threads then spin
    against each other, which stalled a two-engine service on a two-core CI host beyond its 30 s request timeout.
    Each engine gets an equal run of the cores instead, after a core per engine kept for the schedulers when there
    are enough: vLLM binds its worker to them (a worker process of its own) and the engine's OpenMP threads are as
    many as its cores (also where vLLM runs the worker inside the engine core, unbound: VLLM_ENABLE_V1_MULTIPROCESSING
    0). What engine.env sets wins, key by key. Engines on a GPU (gpu, or engine.device cuda) are left as they are, as
    pin_threads leaves them: their threads only feed the GPU (engines.vllm.GPU_ENV decides them, unless the
    environment already names a count, which a share's would be).
    """
    if count == 1 or gpu or cfg.device == "cuda":
        return [cfg] * count
    ordered = sorted(cores)
    if len(ordered) < count:  # fewer cores than engines: unbound, one thread each
        shares = [{"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}] * count
    else:
        usable = ordered[: len(ordered) - count] if len(ordered) >= 2 * count else ordered
        size = len(usable) // count
        shares = [{"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in usable[i * size : (i + 1) * size]),
                   "OMP_NUM_THREADS": str(size)} for i in range(count)]
    return [cfg.model_copy(update={"env": {**share, **cfg.env}}) for share in shares]


# Threads of xgrammar's batch matcher for the service's engine on a GPU (engine.batch_grammar_masks unset). One step's
# masks for 80 answers on the lent H100's host CPU: 4.47 ms one after another (vLLM's fill), 1.23 ms on 4 threads,
# 0.92 ms on 8; one thread is no faster than vLLM's (bench/results/serve_latency_h100_stop39.json). Half the cores
# leaves the rest to the workers and the engine core's step loop.
MASK_THREADS_MAX = 8


def service_mask_threads(cores: int) -> int:
    """Batch matcher threads for a service engine on a GPU, given the process's cores: half, at most 8; 0 (vLLM's own
    fill) where that is under 2."""
    threads = min(MASK_THREADS_MAX, cores // 2)
    return threads if threads >= 2 else 0


# vLLM's own share of a GPU's memory for an engine that is given none (EngineArgs.gpu_memory_utilization).
VLLM_DEFAULT_GPU_SHARE = 0.9


def share_gpu_memory(cfg: EngineConfig, count: int) -> EngineConfig:
    """cfg for each of `count` vLLM engines of one service on one GPU (serve.engines): an equal part each of the
    service's share, engine.gpu_memory_utilization (unset: vLLM's default). The share is what the operator splits a
    GPU by, the service's beside the executors' (0.35 and 0.45, README); with each engine taking all of it, two
    engines would take 0.7 and collide with the executors', or, unset, the second would fail its start on the memory
    the first holds, a minute after the first loaded."""
    if count == 1:
        return cfg
    share = cfg.gpu_memory_utilization or VLLM_DEFAULT_GPU_SHARE
    return cfg.model_copy(update={"gpu_memory_utilization": round(share / count, 4)})


def driver_only(what: str = "this function") -> None:
    """Raise when called inside a Spark task: driver-side checks read the driver's conf, not a task's."""
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        raise RuntimeError(f"{what} must run on the Spark driver, not inside a Spark task")


def is_local_master(master: str) -> bool:
    """local, local[N], local[*], local[N,F]: one JVM, no executors (local-cluster[...] has real executors)."""
    master = master.strip()
    return master == "local" or master.startswith("local[")


def conf_number(conf: Mapping[str, str], key: str) -> float:
    """A numeric Spark setting (unset or blank: 0); a ConfigError naming the key when it is not a number."""
    raw = str(conf.get(key, "0")).strip() or "0"
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number") from None


DYNAMIC_ALLOCATION = "spark.dynamicAllocation.enabled"
# Cluster managers that honour a task-only ResourceProfile with dynamic allocation off (standalone since Spark
# 3.4, YARN and Kubernetes since 4.0): the stage runs on the executors started for the default profile.
_STAGE_LEVEL_MASTERS = ("spark://", "local-cluster[", "yarn", "k8s://")


def dynamic_allocation(conf: Mapping[str, str]) -> bool:
    """Whether the application runs with dynamic allocation."""
    return str(conf.get(DYNAMIC_ALLOCATION, "false")).strip().lower() == "true"


def stage_level_supported(conf: Mapping[str, str]) -> tuple[bool, str]:
    """Whether a task-only ResourceProfile can be used with these settings, and why not when it cannot."""
    master = str(conf.get("spark.master", ""))
    if is_local_master(master):
        return False, f"master {master} (local mode offers no resources to tasks)"
    if not master.startswith(_STAGE_LEVEL_MASTERS):
        return False, f"master {master or 'unknown'} (stage-level scheduling needs standalone, YARN or Kubernetes)"
    if dynamic_allocation(conf):
        # With dynamic allocation a task-only profile would start a second set of executors for it.
        return False, f"{DYNAMIC_ALLOCATION}=true"
    return True, ""


def check_gpu_conf(conf: Mapping[str, str], cfg: QwenSparkConfig) -> None:
    """Refuse Spark settings that would leave a GPU job without GPUs or put two engines on one GPU.

    conf: the driver's Spark settings (dict(sparkContext.getConf().getAll())). With stage-level scheduling the
    inference stage asks for whole GPUs itself, so spark.task.resource.gpu.amount may be unset or fractional
    (the read, clean and write stages then hold no GPU, or share them); without it (dynamic allocation on),
    the inference tasks take the default task settings, which must then give each task whole GPUs.
    """
    driver_only("check_gpu_conf")
    engine = cfg.engine
    master = str(conf.get("spark.master", ""))
    local = is_local_master(master)

    if str(conf.get(WORKER_REUSE, "true")).strip().lower() != "true":
        raise ConfigError(f"{WORKER_REUSE}=false: every task would load the model again; set it to true")

    executor_gpus = conf_number(conf, EXECUTOR_GPU_AMOUNT)
    task_gpus = conf_number(conf, TASK_GPU_AMOUNT)
    if engine.kind not in IN_PROCESS_KINDS:
        if engine.device == "cuda":
            log.warning("engine.device=cuda has no effect with engine.kind=%s: the server holds the GPUs", engine.kind)
        return

    if local:
        # Measured with pyspark 4.3, local[2]: a stage whose tasks ask for a GPU stays at 0 running tasks
        # for ever, because local mode offers no resources. GPUs there are claimed per engine instead.
        if task_gpus > 0:
            raise ConfigError(
                f"{TASK_GPU_AMOUNT}={task_gpus:g} with master {master}: local mode offers no resources, so the "
                f"tasks would never be scheduled; unset it (with engine.device=cuda each engine claims a free GPU)"
            )
        return

    if engine.device == "cuda" and executor_gpus <= 0:
        raise ConfigError(
            f"engine.device=cuda but {EXECUTOR_GPU_AMOUNT} is {'unset' if EXECUTOR_GPU_AMOUNT not in conf else '0'} "
            f"(master {master or 'unknown'}): executors would start without GPUs; set {EXECUTOR_GPU_AMOUNT}=1 "
            f"and a discovery script (see conf/spark-defaults-gpu.conf)"
        )
    if executor_gpus <= 0:
        return
    if engine.device == "cpu":
        log.warning("%s=%g but engine.device=cpu: the executors' GPUs stay idle", EXECUTOR_GPU_AMOUNT, executor_gpus)
        return
    stage_level, why_not = stage_level_supported(conf)
    if stage_level:
        if task_gpus >= 1:
            log.warning(
                "%s=%g makes every stage's tasks (read, clean, write) hold GPUs; unset it or make it fractional: "
                "the inference stage asks for its GPUs itself",
                TASK_GPU_AMOUNT,
                task_gpus,
            )
        return
    _check_default_task_gpus(executor_gpus, task_gpus, engine.kind, why_not)


def _check_default_task_gpus(executor_gpus: float, task_gpus: float, kind: str, why_not: str) -> None:
    """Without stage-level scheduling the inference tasks take the default settings: whole GPUs per task."""
    if task_gpus < 1 or not task_gpus.is_integer():
        if task_gpus <= 0:
            raise ConfigError(
                f"{TASK_GPU_AMOUNT} is unset but {EXECUTOR_GPU_AMOUNT}={executor_gpus:g} and stage-level scheduling "
                f"is unavailable ({why_not}): tasks would hold no GPU while each loads an engine; set "
                f"{TASK_GPU_AMOUNT}={executor_gpus:g}"
            )
        raise ConfigError(
            f"{TASK_GPU_AMOUNT}={task_gpus:g} is fractional and stage-level scheduling is unavailable ({why_not}): "
            f"several tasks would share a GPU and each load its own engine (engine.kind={kind}) on it; use "
            f"a whole number, {TASK_GPU_AMOUNT}={executor_gpus:g}"
        )
    if task_gpus < executor_gpus:
        log.warning(
            "%s=%g < %s=%g: an executor runs several engines, and a reused Python worker handed another GPU "
            "reloads its engine; one executor per engine avoids that",
            TASK_GPU_AMOUNT, task_gpus, EXECUTOR_GPU_AMOUNT, executor_gpus,
        )
