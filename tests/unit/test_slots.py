"""Slot planning on the driver: engines at once, partitions, resources per engine, the inference profile."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from qwenspark.config import load_config
from qwenspark.slots import SlotPlan, plan_slots

ROOT = Path(__file__).resolve().parents[2]


def fake_spark(conf: dict[str, str], parallelism: int = 2, registered: int = 1) -> object:
    tracker = types.SimpleNamespace(getExecutorInfos=lambda: [object()] * (registered + 1))  # + the driver
    jsc = types.SimpleNamespace(sc=lambda: types.SimpleNamespace(statusTracker=lambda: tracker))
    sc = types.SimpleNamespace(
        getConf=lambda: types.SimpleNamespace(getAll=lambda: list(conf.items())),
        defaultParallelism=parallelism,
        _jsc=jsc,
    )
    return types.SimpleNamespace(sparkContext=sc)


def plan(conf: dict[str, str], *overrides: str, **spark: int) -> SlotPlan:
    cfg = load_config(ROOT / "conf" / "local.yaml", ["job.slots=null", *overrides])
    return plan_slots(fake_spark(conf, **spark), cfg)  # type: ignore[arg-type]


def task_requests(p: SlotPlan) -> dict[str, float]:
    return {name: req.amount for name, req in p.profile.taskResources.items()}


STANDALONE = {"spark.master": "spark://h:7077", "spark.executor.cores": "8", "spark.executor.resource.gpu.amount": "1"}


def test_four_executors_of_one_gpu_are_four_slots_with_a_gpu_profile() -> None:
    p = plan({**STANDALONE, "spark.cores.max": "32"})
    assert (p.slots, p.partitions, p.gpus_per_slot, p.cores_per_slot, p.stage_level) == (4, 4, 1, 8, True)
    assert task_requests(p) == {"cpus": 8, "gpu": 1}


def test_two_gpus_per_executor_are_two_engines_sharing_its_cores() -> None:
    p = plan({**STANDALONE, "spark.executor.resource.gpu.amount": "2", "spark.executor.instances": "2"})
    assert (p.slots, p.gpus_per_slot, p.cores_per_slot) == (4, 1, 4)


def test_tensor_parallel_engines_take_several_gpus_each() -> None:
    p = plan({**STANDALONE, "spark.executor.resource.gpu.amount": "2", "spark.executor.instances": "3"},
             "engine.tensor_parallel_size=2")
    assert (p.slots, p.gpus_per_slot, p.cores_per_slot) == (3, 2, 8)
    assert task_requests(p)["gpu"] == 2


def test_partitions_per_slot_and_repartition_override() -> None:
    conf = {**STANDALONE, "spark.executor.instances": "4"}
    assert plan(conf, "job.partitions_per_slot=3").partitions == 12
    assert plan(conf, "job.repartition=5").partitions == 5
    assert plan(conf, "job.slots=2").slots == 2


def test_dynamic_allocation_falls_back_to_the_default_task_settings() -> None:
    p = plan({**STANDALONE, "spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.maxExecutors": "6",
              "spark.task.resource.gpu.amount": "1"})
    assert (p.slots, p.stage_level, p.profile) == (6, False, None)
    assert "dynamicAllocation" in p.reason


def test_registered_executors_when_nothing_says_how_many() -> None:
    assert plan(STANDALONE, registered=3).slots == 3


def test_cpu_cluster_runs_one_engine_per_executor_on_all_its_cores() -> None:
    p = plan({"spark.master": "yarn", "spark.executor.cores": "4", "spark.executor.instances": "3"})
    assert (p.slots, p.gpus_per_slot, p.cores_per_slot, p.stage_level) == (3, 0, 4, True)
    assert task_requests(p) == {"cpus": 4}


@pytest.mark.parametrize(("master", "slots", "expected"), [("local[2]", None, (1, 1, 2)), ("local[4]", 2, (2, 2, 2))])
def test_local_mode_is_one_partition_per_slot(master: str, slots: int | None, expected: tuple[int, int, int]) -> None:
    p = plan({"spark.master": master}, f"job.slots={slots if slots else 'null'}")
    assert (p.slots, p.partitions, p.cores_per_slot) == expected and not p.stage_level


def test_a_server_engine_takes_request_slots_only() -> None:
    p = plan(STANDALONE, "engine.kind=openai", "engine.base_url=http://127.0.0.1:8000/v1", parallelism=16)
    assert (p.slots, p.gpus_per_slot, p.profile) == (16, 0, None)
