"""GPU settings: driver-side refusals that name the setting, executor-side pinning, the discovery script."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from pyspark import TaskContext
from pyspark.resource import ResourceInformation

from qwenspark import resources
from qwenspark.config import EngineConfig, QwenSparkConfig, load_config
from qwenspark.errors import ConfigError, EngineError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "conf" / "getGpusResources.sh"

CLUSTER = "spark://10.0.0.1:7077"
GOOD = {
    "spark.master": CLUSTER,
    "spark.executor.resource.gpu.amount": "1",
    "spark.task.resource.gpu.amount": "1",
    "spark.python.worker.reuse": "true",
}


def cfg_with(*overrides: str) -> QwenSparkConfig:
    return load_config(ROOT / "conf" / "local.yaml", list(overrides))


def conf_with(**changes: str | None) -> dict[str, str]:
    """GOOD with keys changed (dots as underscores: spark_task_resource_gpu_amount); None removes a key."""
    conf = dict(GOOD)
    for key, value in changes.items():
        dotted = key.replace("_", ".")
        if value is None:
            conf.pop(dotted, None)
        else:
            conf[dotted] = value
    return conf


@pytest.fixture
def task(monkeypatch: pytest.MonkeyPatch) -> TaskContext:
    """A TaskContext as a Python worker has one (partition 3, no resources); the driver has none."""
    ctx = object.__new__(TaskContext)
    ctx._partitionId = 3
    ctx._resources = {}
    ctx._localProperties = {}
    monkeypatch.setattr(TaskContext, "_taskContext", ctx)
    return ctx


# --- driver side: check_gpu_conf -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "kind", "conf"),
    [
        ("cuda", "vllm", GOOD),
        ("auto", "vllm", GOOD),
        ("auto", "transformers", GOOD),
        # Two GPUs per executor, both held by its one task: one engine with tensor parallelism 2.
        ("cuda", "vllm", conf_with(spark_executor_resource_gpu_amount="2", spark_task_resource_gpu_amount="2")),
        # No GPU settings at all: fine unless the config insists on cuda.
        ("auto", "vllm", conf_with(spark_executor_resource_gpu_amount=None, spark_task_resource_gpu_amount=None)),
        ("cpu", "vllm", conf_with(spark_executor_resource_gpu_amount=None, spark_task_resource_gpu_amount=None)),
        # GPUs reserved but device=cpu: wasteful, not wrong (a warning).
        ("cpu", "vllm", conf_with(spark_task_resource_gpu_amount="0.5")),
        # Local mode: no executor settings needed; task i takes GPU i.
        ("cuda", "vllm", {"spark.master": "local[2]"}),
        ("cuda", "vllm", {"spark.master": "local"}),
        ("cuda", "vllm", {"spark.master": "local[*]", "spark.executor.resource.gpu.amount": "1"}),
        # Stage-level scheduling (standalone, YARN, Kubernetes without dynamic allocation): the inference stage asks
        # for whole GPUs itself, so the default task amount may be unset, fractional or below the executor's.
        ("auto", "vllm", conf_with(spark_task_resource_gpu_amount=None)),
        ("cuda", "vllm", conf_with(spark_task_resource_gpu_amount="0.125")),
        ("auto", "vllm", conf_with(spark_executor_resource_gpu_amount="2")),
        ("cuda", "transformers", {**conf_with(spark_task_resource_gpu_amount=None), "spark.master": "yarn"}),
        # A server engine holds no GPU in the executors: fractional amounts are the user's business.
        ("auto", "openai", conf_with(spark_task_resource_gpu_amount="0.25")),
    ],
)
def test_check_gpu_conf_accepts(device: str, kind: str, conf: dict[str, str]) -> None:
    extra = ["engine.base_url=http://127.0.0.1:8000/v1"] if kind == "openai" else []
    resources.check_gpu_conf(conf, cfg_with(f"engine.device={device}", f"engine.kind={kind}", *extra))


@pytest.mark.parametrize(
    ("device", "kind", "conf", "setting"),
    [
        # (a) the config asks for GPUs, the cluster gives executors none
        ("cuda", "vllm", conf_with(spark_executor_resource_gpu_amount=None), "spark.executor.resource.gpu.amount"),
        ("cuda", "vllm", conf_with(spark_executor_resource_gpu_amount="0"), "spark.executor.resource.gpu.amount"),
        ("cuda", "vllm", {"spark.master": "yarn"}, "spark.executor.resource.gpu.amount"),
        ("cuda", "vllm", {"spark.master": "local-cluster[2,1,1024]"}, "spark.executor.resource.gpu.amount"),
        # (b) without stage-level scheduling (dynamic allocation on) the inference tasks take the default task
        # settings: they must hold whole GPUs
        ("auto", "vllm", conf_with(spark_task_resource_gpu_amount=None, spark_dynamicAllocation_enabled="true"),
         "spark.task.resource.gpu.amount"),
        # (c) ... and a fractional amount there means two engines on one GPU
        ("auto", "vllm", conf_with(spark_task_resource_gpu_amount="0.5", spark_dynamicAllocation_enabled="true"),
         "spark.task.resource.gpu.amount"),
        ("cuda", "transformers",
         conf_with(spark_task_resource_gpu_amount="0.25", spark_dynamicAllocation_enabled="true"),
         "spark.task.resource.gpu.amount"),
        # (d) no worker reuse: one model load per task
        ("auto", "vllm", conf_with(spark_python_worker_reuse="false"), "spark.python.worker.reuse"),
        ("cpu", "openai", conf_with(spark_python_worker_reuse="False"), "spark.python.worker.reuse"),
        # local mode never schedules a task that asks for a GPU (it hangs: measured)
        ("auto", "vllm", {"spark.master": "local[2]", "spark.task.resource.gpu.amount": "1"},
         "spark.task.resource.gpu.amount"),
        # garbage
        ("auto", "vllm", conf_with(spark_task_resource_gpu_amount="one"), "spark.task.resource.gpu.amount"),
    ],
)
def test_check_gpu_conf_refuses_naming_the_setting(device: str, kind: str, conf: dict[str, str], setting: str) -> None:
    extra = ["engine.base_url=http://127.0.0.1:8000/v1"] if kind == "openai" else []
    cfg = cfg_with(f"engine.device={device}", f"engine.kind={kind}", *extra)
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        resources.check_gpu_conf(conf, cfg)


def test_check_gpu_conf_is_driver_only(task: TaskContext) -> None:
    with pytest.raises(RuntimeError, match="driver"):
        resources.check_gpu_conf(GOOD, cfg_with())


def test_driver_only_passes_on_the_driver() -> None:
    assert TaskContext.get() is None
    resources.driver_only()


def test_device_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"engine\.device"):
        cfg_with("engine.device=gpu")


# --- executor side: task_gpu_addresses / pin_task_gpus ------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    # pin_task_gpus writes os.environ directly. setenv first, so that monkeypatch records the variable even
    # when it was absent and removes it again afterwards (a bare delenv of an absent name records nothing,
    # and "2,3" then leaked into the Spark workers of later tests: tensor parallel 2 on the CPU).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(resources, "visible_gpu_count", lambda: None)
    monkeypatch.setattr(resources, "_INHERITED_VISIBLE", None)
    return monkeypatch


def engine(**update: object) -> EngineConfig:
    return cfg_with().engine.model_copy(update=update)


def test_pin_uses_the_task_resources_first(clean_env: pytest.MonkeyPatch, task: TaskContext) -> None:
    task._resources = {"gpu": ResourceInformation("gpu", ["2", "3"])}
    cfg, devices = resources.pin_task_gpus(engine())
    assert devices == ["2", "3"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert cfg.tensor_parallel_size == 2


@pytest.mark.parametrize(
    ("inherited", "spark", "visible"),
    [
        # The cluster manager isolated GPUs 4-7 and discovery ran inside that view: Spark's ids index into it.
        ("4,5,6,7", ["1", "3"], "5,7"),
        ("GPU-aaa,GPU-bbb", ["1"], "GPU-bbb"),
        # Discovery printed the host ids the inherited list names: taken as they are.
        ("2,3", ["3"], "3"),
        ("2,3", ["2", "3"], "2,3"),
    ],
)
def test_pin_indexes_into_an_inherited_cuda_visible_devices(
    clean_env: pytest.MonkeyPatch, task: TaskContext, inherited: str, spark: list[str], visible: str
) -> None:
    clean_env.setattr(resources, "_INHERITED_VISIBLE", inherited)
    task._resources = {"gpu": ResourceInformation("gpu", spark)}
    _, devices = resources.pin_task_gpus(engine())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible and devices == visible.split(",")


def test_pin_refuses_an_address_outside_the_inherited_list(clean_env: pytest.MonkeyPatch, task: TaskContext) -> None:
    clean_env.setattr(resources, "_INHERITED_VISIBLE", "4,5")
    task._resources = {"gpu": ResourceInformation("gpu", ["7"])}
    with pytest.raises(EngineError, match="CUDA_VISIBLE_DEVICES=4,5"):
        resources.pin_task_gpus(engine())


def test_pin_keeps_an_explicit_tensor_parallel_size(clean_env: pytest.MonkeyPatch, task: TaskContext) -> None:
    task._resources = {"gpu": ResourceInformation("gpu", ["0", "1"])}
    cfg, _ = resources.pin_task_gpus(engine(tensor_parallel_size=1))
    assert cfg.tensor_parallel_size == 1


def test_pin_falls_back_to_cuda_visible_devices(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(resources, "_INHERITED_VISIBLE", "1, 4")
    cfg, addresses = resources.pin_task_gpus(engine())
    assert addresses == ["1", "4"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,4"
    assert cfg.tensor_parallel_size == 2


def test_pin_without_gpus_changes_nothing(clean_env: pytest.MonkeyPatch, task: TaskContext) -> None:
    cfg, addresses = resources.pin_task_gpus(engine())
    assert addresses == []
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert cfg.tensor_parallel_size == 1


def hold_claim(folder: Path, name: str) -> subprocess.Popen[str]:
    """Another process (another engine's worker) holding a claim file until killed."""
    code = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen(["python3", "-c", code, str(folder / f"{name}.lock")], stdout=subprocess.PIPE, text=True)
    # (a claim this process still holds would block it: tests close their handles first)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_pin_cuda_in_local_mode_claims_a_free_gpu(
    clean_env: pytest.MonkeyPatch, task: TaskContext, tmp_path: Path
) -> None:
    clean_env.setenv("QWENSPARK_CLAIMS_DIR", str(tmp_path))
    clean_env.setattr(resources, "_CLAIMS", {})
    clean_env.setattr(resources, "visible_gpu_count", lambda: 2)
    other = hold_claim(tmp_path, "gpu-0")  # another worker's engine sits on GPU 0
    try:
        cfg, devices = resources.pin_task_gpus(engine(device="cuda"))
        assert devices == ["1"] and os.environ["CUDA_VISIBLE_DEVICES"] == "1" and cfg.tensor_parallel_size == 1
        # The next task of this worker keeps its GPU.
        assert resources.pin_task_gpus(engine(device="cuda"))[1] == ["1"]
        # A third engine on the host finds none free and fails loudly instead of doubling up on a GPU.
        for handle in resources._CLAIMS.values():
            handle.close()
        clean_env.setattr(resources, "_CLAIMS", {})
        third = hold_claim(tmp_path, "gpu-1")
        try:
            with pytest.raises(EngineError, match="only 0 of the 1 GPU"):
                resources.pin_task_gpus(engine(device="cuda"))
        finally:
            third.kill()
    finally:
        other.kill()
        for handle in resources._CLAIMS.values():
            handle.close()


def test_pin_threads_claims_cores_no_other_engine_holds(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("QWENSPARK_CLAIMS_DIR", str(tmp_path))
    clean_env.setattr(resources, "_CLAIMS", {})
    clean_env.setattr(resources, "_BINDINGS", {})
    cores = sorted(os.sched_getaffinity(0))
    other = hold_claim(tmp_path, f"core-{cores[0]}")
    try:
        cfg, bound = resources.pin_threads(engine(), 1)
        assert bound == [cores[1]] if len(cores) > 1 else bound == []
        assert cfg.env["OMP_NUM_THREADS"] == "1"
        if bound:
            assert cfg.env["VLLM_CPU_OMP_THREADS_BIND"] == str(cores[1])
        # The decision sticks for the process (it is part of the engine cache key): the same answer again.
        assert resources.pin_threads(engine(), 1)[0].env == cfg.env
        # Asking for more cores than are free: threads stay unbound rather than share another engine's cores,
        # and the partial claim is given back.
        cfg, bound = resources.pin_threads(engine(), len(cores))
        assert bound == [] and cfg.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
        assert resources.claimed("core-") == ([str(cores[1])] if len(cores) > 1 else [])
        # What the user put in engine.env wins.
        cfg, _ = resources.pin_threads(engine(env={"OMP_NUM_THREADS": "7", "VLLM_CPU_OMP_THREADS_BIND": "0"}), 1)
        assert (cfg.env["OMP_NUM_THREADS"], cfg.env["VLLM_CPU_OMP_THREADS_BIND"]) == ("7", "0")
    finally:
        other.kill()
        for handle in resources._CLAIMS.values():
            handle.close()



def test_an_engine_on_gpus_keeps_its_threads_unpinned(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Its threads only feed the GPU: no cores claimed, and OMP_NUM_THREADS left to engines.vllm.GPU_ENV.
    clean_env.setenv("QWENSPARK_CLAIMS_DIR", str(tmp_path))
    clean_env.setattr(resources, "_CLAIMS", {})
    clean_env.setattr(resources, "_BINDINGS", {})
    for cfg, gpus in ((engine(), ["0"]), (engine(device="cuda"), [])):
        assert resources.pin_threads(cfg, 4, gpus) == (cfg, [])
    assert resources.claimed("core-") == []
    try:
        assert resources.pin_threads(engine(), 4)[0].env["OMP_NUM_THREADS"] == "4"  # a CPU engine still gets them
    finally:
        for handle in resources._CLAIMS.values():
            handle.close()


def test_the_gpu_environment_sits_under_the_users() -> None:
    from qwenspark.engines.vllm import gpu_env

    environ = {"PATH": "/bin", "OMP_NUM_THREADS": "16"}  # Spark's value in a task: not the user's choice
    gpu_env(environ, chosen={})
    assert environ == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    environ = {"OMP_NUM_THREADS": "4"}  # engine.env (applied first); the service also counts the shell's
    gpu_env(environ, chosen={"OMP_NUM_THREADS": "4"})
    assert environ == {"OMP_NUM_THREADS": "4"}


@pytest.mark.parametrize(("count", "cores", "binds"), [
    (2, range(16), ["0,1,2,3,4,5,6", "7,8,9,10,11,12,13"]),  # 14 and 15 left to the two engine cores' schedulers
    (2, [5, 1, 3, 7], ["1", "3"]),                           # the process's affinity, in order; a core each kept
    (2, [0, 1], ["0", "1"]),                                 # too few to keep any: a core each
    (3, range(8), ["0", "1", "2"]),                         # 8 - 3 kept = 5: a core each, two left over
])
def test_engines_of_one_service_get_disjoint_cores(count: int, cores: range | list[int], binds: list[str]) -> None:
    cfg = EngineConfig(kind="vllm", model="m", env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    shares = resources.share_cores(cfg, count, list(cores))
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in shares] == binds
    assert [s.env["OMP_NUM_THREADS"] for s in shares] == [str(len(b.split(","))) for b in binds]
    assert all(s.env["VLLM_CPU_KVCACHE_SPACE"] == "1" for s in shares)
    bound = [c for s in shares for c in s.env["VLLM_CPU_OMP_THREADS_BIND"].split(",")]
    assert len(bound) == len(set(bound))


def test_engines_outnumbering_cores_run_unbound_on_a_thread_each() -> None:
    shares = resources.share_cores(EngineConfig(kind="vllm", model="m"), 3, [0, 1])
    assert [(s.env["VLLM_CPU_OMP_THREADS_BIND"], s.env["OMP_NUM_THREADS"]) for s in shares] == [("nobind", "1")] * 3


def test_one_engine_or_the_users_settings_are_left_as_they_are() -> None:
    cfg = EngineConfig(kind="vllm", model="m")
    assert resources.share_cores(cfg, 1, list(range(16))) == [cfg]
    # engines on a GPU keep GPU_ENV's one OpenMP thread (a share's count in the environment would count as chosen)
    assert resources.share_cores(cfg, 2, list(range(16)), gpu=True) == [cfg, cfg]
    cuda = EngineConfig(kind="vllm", model="m", device="cuda")
    assert resources.share_cores(cuda, 3, list(range(16))) == [cuda] * 3
    mine = EngineConfig(kind="vllm", model="m", env={"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "3"})
    assert resources.share_cores(mine, 2, list(range(16))) == [mine, mine]
    threads = EngineConfig(kind="vllm", model="m", env={"OMP_NUM_THREADS": "2"})
    assert [s.env for s in resources.share_cores(threads, 2, list(range(16)))] == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0,1,2,3,4,5,6", "OMP_NUM_THREADS": "2"},
        {"VLLM_CPU_OMP_THREADS_BIND": "7,8,9,10,11,12,13", "OMP_NUM_THREADS": "2"}]


def test_pin_cuda_on_the_driver_finds_nothing(clean_env: pytest.MonkeyPatch) -> None:
    assert resources.task_gpu_addresses("cuda") == []


def test_pin_cpu_hides_the_gpus(clean_env: pytest.MonkeyPatch, task: TaskContext) -> None:
    task._resources = {"gpu": ResourceInformation("gpu", ["0"])}
    cfg, addresses = resources.pin_task_gpus(engine(device="cpu"))
    assert addresses == []
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert cfg.tensor_parallel_size == 1


def test_pin_with_addresses_patched(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setattr(resources, "task_gpu_addresses", lambda device="auto": ["7"])
    cfg, addresses = resources.pin_task_gpus(engine())
    assert (addresses, os.environ["CUDA_VISIBLE_DEVICES"], cfg.tensor_parallel_size) == (["7"], "7", 1)


# --- the discovery script ---------------------------------------------------------------------------------


def run_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "QWENSPARK_FAKE_GPUS"}
    return subprocess.run([str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=30, check=False)


def test_discovery_script_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.parametrize(("fake", "addresses"), [("0,1", ["0", "1"]), ("3", ["3"]), (" 0, 2 ", ["0", "2"]), ("", [])])
def test_discovery_script_prints_fake_gpus_as_spark_expects(fake: str, addresses: list[str]) -> None:
    out = run_script({"QWENSPARK_FAKE_GPUS": fake})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"name": "gpu", "addresses": addresses}


def test_discovery_script_reads_nvidia_smi(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nprintf "0\\n1\\n2\\n"\n')
    smi.chmod(0o755)
    out = run_script({"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"name": "gpu", "addresses": ["0", "1", "2"]}


def test_discovery_script_fails_without_nvidia_smi() -> None:
    if any(Path(d, "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this host has nvidia-smi")
    out = run_script({"PATH": "/usr/bin:/bin"})
    # Spark must see a failure, not an empty GPU list: the message goes to stderr, nothing to stdout.
    assert out.returncode != 0
    assert "nvidia-smi not found" in out.stderr
    assert out.stdout == ""


def test_discovery_script_fails_when_nvidia_smi_fails(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA-SMI has failed" >&2\nexit 9\n')
    smi.chmod(0o755)
    out = run_script({"PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert out.returncode != 0
    assert "NVIDIA-SMI has failed" in out.stderr
    assert out.stdout == ""


def test_discovery_script_refuses_bad_fake_addresses() -> None:
    out = run_script({"QWENSPARK_FAKE_GPUS": "0,x"})
    assert out.returncode != 0
    assert "QWENSPARK_FAKE_GPUS" in out.stderr


# --- the shipped GPU cluster files agree with the checks ---------------------------------------------------


def read_properties(path: Path) -> dict[str, str]:
    """Spark's properties-file format as far as these files use it: `key value` lines, # comments."""
    conf = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            conf[key] = value.strip()
    return conf


def test_cluster_gpu_files_pass_the_checks() -> None:
    cfg = load_config(ROOT / "conf" / "cluster-gpu.yaml")
    assert cfg.engine.device == "cuda"
    assert cfg.spark.master is None
    conf = read_properties(ROOT / "conf" / "spark-defaults-gpu.conf")
    assert conf["spark.executor.resource.gpu.discoveryScript"].endswith("getGpusResources.sh")
    resources.check_gpu_conf({**conf, "spark.master": "yarn"}, cfg)
    # Without the GPU settings the same config is refused.
    with pytest.raises(ConfigError, match=r"spark\.executor\.resource\.gpu\.amount"):
        resources.check_gpu_conf({"spark.master": "yarn"}, cfg)


def test_engines_on_one_gpu_split_the_services_share() -> None:
    unset = EngineConfig(kind="vllm", model="m")  # vLLM's default share, 0.9
    assert [resources.share_gpu_memory(unset, n).gpu_memory_utilization for n in (1, 2, 3)] == [None, 0.45, 0.3]
    mine = EngineConfig(kind="vllm", model="m", gpu_memory_utilization=0.35)  # beside the executors' 0.45
    assert [resources.share_gpu_memory(mine, n).gpu_memory_utilization for n in (1, 2, 3)] == [0.35, 0.175, 0.1167]
