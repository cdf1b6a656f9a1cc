"""Driver side: how many engines run at once (slots), the partitions fed to them, and the inference stage's
ResourceProfile (stage-level scheduling: only that stage asks for GPUs and the engine's cores)."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qwenspark.config import QwenSparkConfig
from qwenspark.errors import ConfigError
from qwenspark.resources import (
    EXECUTOR_GPU_AMOUNT,
    IN_PROCESS_KINDS,
    TASK_GPU_AMOUNT,
    conf_number,
    driver_only,
    dynamic_allocation,
    is_local_master,
    stage_level_supported,
    visible_gpu_count,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SlotPlan:
    """How the inference stage runs: engines at once, partitions, resources per engine, and its profile."""

    slots: int
    partitions: int
    gpus_per_slot: int  # 0: the engines run on CPU (or call a server)
    cores_per_slot: int  # threads each engine gets
    stage_level: bool  # the inference stage carries its own ResourceProfile
    reason: str  # how the figures were found (logged, and kept in the run summary)
    profile: Any = None  # pyspark.resource.ResourceProfile or None


def local_cores(master: str) -> int:
    """Cores of a local[N] / local[N,F] / local[*] master (local: 1)."""
    found = re.match(r"local\[(\*|\d+)", master.strip())
    if not found:
        return 1
    return (os.cpu_count() or 1) if found.group(1) == "*" else int(found.group(1))


def executor_count(spark: SparkSession, conf: Mapping[str, str]) -> tuple[int, str]:
    """Executors the application has or asked for, and where the figure came from."""
    if dynamic_allocation(conf):
        top = int(conf_number(conf, "spark.dynamicAllocation.maxExecutors"))
        if top > 0:
            return top, "spark.dynamicAllocation.maxExecutors"
    instances = int(conf_number(conf, "spark.executor.instances"))
    if instances > 0:
        return instances, "spark.executor.instances"
    cores_max, cores = conf_number(conf, "spark.cores.max"), conf_number(conf, "spark.executor.cores")
    if cores_max > 0 and cores > 0:
        return max(1, int(cores_max // cores)), "spark.cores.max / spark.executor.cores"
    # Registered executors (the tracker lists the driver too).
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return max(1, len(infos) - 1), "registered executors"


def plan_slots(spark: SparkSession, cfg: QwenSparkConfig) -> SlotPlan:
    """The slot plan for cfg on this Spark application (read on the driver, captured by the tasks)."""
    driver_only("plan_slots")
    conf = dict(spark.sparkContext.getConf().getAll())
    master = str(conf.get("spark.master", ""))
    job, engine = cfg.job, cfg.engine

    if engine.kind not in IN_PROCESS_KINDS:
        # A server holds the model: tasks only send requests; no GPUs or engine cores in Spark.
        slots = job.slots or spark.sparkContext.defaultParallelism
        return _finish(cfg, slots, 0, 1, stage_level=False, why=f"engine.kind={engine.kind}: {slots} request slots")

    if is_local_master(master):
        cores = local_cores(master)
        gpus = 0
        if engine.device == "cuda":
            gpus = engine.tensor_parallel_size or 1
            slots = job.slots or max(1, (visible_gpu_count() or 1) // gpus)
        else:
            slots = job.slots or 1
        per = job.cores_per_slot or max(1, cores // slots)
        why = f"local mode, {cores} cores: {slots} engine(s) of {per} core(s)" + (f", {gpus} GPU each" if gpus else "")
        # Local mode runs as many tasks at once as it has cores, whatever a stage asks: one partition per slot
        # is the only way to keep it to one engine per slot.
        return _finish(cfg, slots, gpus, per, stage_level=False, partitions=job.repartition or slots,
                       why=why + "; no stage-level scheduling in local mode, one partition per slot")

    executors, source = executor_count(spark, conf)
    executor_gpus = conf_number(conf, EXECUTOR_GPU_AMOUNT)
    executor_cores = int(conf_number(conf, "spark.executor.cores")) or max(
        1, spark.sparkContext.defaultParallelism // executors
    )
    if engine.device != "cpu" and executor_gpus > 0:
        task_gpus = conf_number(conf, TASK_GPU_AMOUNT)
        gpus = engine.tensor_parallel_size or (int(task_gpus) if task_gpus >= 1 else 1)
        per_executor = int(executor_gpus // gpus)
        if per_executor < 1:
            raise ConfigError(
                f"engine.tensor_parallel_size={gpus} but executors have {EXECUTOR_GPU_AMOUNT}={executor_gpus:g}"
            )
        why = f"{executors} executors ({source}) x {executor_gpus:g} GPU / {gpus} GPU per engine"
    else:
        gpus, per_executor = 0, max(1, executor_cores // (job.cores_per_slot or executor_cores))
        why = f"{executors} executors ({source}) x {per_executor} CPU engine(s)"
    slots = job.slots or executors * per_executor
    per = job.cores_per_slot or max(1, executor_cores // per_executor)
    supported, why_not = stage_level_supported(conf)
    profile = _profile(gpus, per) if supported else None
    if not supported:
        why += f"; stage-level scheduling unavailable ({why_not}): the inference stage uses the default task settings"
    return _finish(cfg, slots, gpus, per, stage_level=supported, why=why, profile=profile)


def _profile(gpus: int, cores: int) -> Any:
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    requests = TaskResourceRequests().cpus(cores)
    if gpus:
        requests = requests.resource("gpu", gpus)
    return ResourceProfileBuilder().require(requests).build


def _finish(
    cfg: QwenSparkConfig,
    slots: int,
    gpus: int,
    cores: int,
    *,
    stage_level: bool,
    why: str,
    profile: Any = None,
    partitions: int | None = None,
) -> SlotPlan:
    partitions = partitions or cfg.job.repartition or slots * cfg.job.partitions_per_slot
    plan = SlotPlan(slots, partitions, gpus, cores, stage_level, why, profile)
    log.info(
        "inference: %d slot(s), %d partition(s), %d GPU(s) and %d core(s) per engine%s (%s)",
        slots,
        partitions,
        gpus,
        cores,
        "; the inference stage alone asks for them (stage-level scheduling)" if stage_level else "",
        why,
    )
    return plan
