"""What a user gets from the wheel: SQL and config templates inside, no test code; a CLI that works outside the
checkout; paths named in the README and the jobs exist; `sql` at the top is a working link to qwenspark/sql."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from qwenspark.cli import TEMPLATES, resolve_config_path
from qwenspark.config import load_config
from qwenspark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

# Repository paths as docs name them: conf/x.yaml, sql/schema.sql, scripts/{a,b}.sh, bench/results/*.json ...
_TOP = "conf|sql|jobs|scripts|bench|dags|notebooks|data|tests|qwenspark"
_PATH = re.compile(rf"(?<![\w./$~-])(?:{_TOP})/[\w.*{{}},/-]*")


def _expand(path: str) -> list[str]:
    """`a/{b,c}.x` -> [`a/b.x`, `a/c.x`] (one or more brace groups)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def _named_paths(text: str) -> set[str]:
    found: set[str] = set()
    for match in _PATH.findall(text):
        # Sentence punctuation after a path is not part of it.
        found.update(p.rstrip(".,") for p in _expand(match.rstrip(".,")))
    return found


def _missing(paths: set[str]) -> list[str]:
    return sorted(p for p in paths if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists()))


def test_paths_named_in_readme_and_jobs_exist() -> None:
    readme = _named_paths((ROOT / "README.md").read_text(encoding="utf-8"))
    assert {"conf/spark-defaults-gpu.conf", "conf/getGpusResources.sh", "sql/schema.sql"} <= readme
    assert _missing(readme) == [], "README.md names paths that do not exist"
    for job in sorted((ROOT / "jobs").glob("*.py")):
        named = _named_paths(job.read_text(encoding="utf-8"))
        assert named, f"{job.name} names no repository path: did the pattern break?"
        assert _missing(named) == [], f"{job.name} names paths that do not exist"


def test_path_pattern() -> None:
    text = "see `conf/{local,cluster-gpu}.yaml`, /opt/qwenspark/conf/x.sh and $SPARK_HOME/conf/y, sql/a.sql."
    assert _named_paths(text) == {"conf/local.yaml", "conf/cluster-gpu.yaml", "sql/a.sql"}


def test_top_level_sql_is_a_link_to_the_package_sql() -> None:
    link = ROOT / "sql"
    assert link.is_symlink(), "sql must be a symlink to qwenspark/sql"
    assert os.readlink(link) == "qwenspark/sql"
    assert link.resolve() == (ROOT / "qwenspark" / "sql").resolve()
    names = sorted(p.name for p in link.iterdir())
    assert {"schema.sql", "upsert.sql", "views.sql"} <= set(names)
    assert names == sorted(p.name for p in (ROOT / "qwenspark" / "sql").iterdir())


@pytest.mark.parametrize("name", TEMPLATES)
def test_packaged_templates_are_conf(name: str) -> None:
    """qwenspark/templates/NAME.yaml links to conf/NAME.yaml: one file, no drift; builds copy the content."""
    packaged = ROOT / "qwenspark" / "templates" / f"{name}.yaml"
    source = ROOT / "conf" / f"{name}.yaml"
    assert packaged.is_symlink() and os.readlink(packaged) == f"../../conf/{name}.yaml"
    assert packaged.read_bytes() == source.read_bytes()
    load_config(packaged)  # a template is a valid config as it stands


def test_config_path_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QWENSPARK_CONFIG", raising=False)
    monkeypatch.chdir(ROOT)
    assert resolve_config_path(None) == Path("conf/local.yaml")
    assert resolve_config_path("x.yaml") == Path("x.yaml")
    monkeypatch.setenv("QWENSPARK_CONFIG", "/etc/qwenspark.yaml")
    assert resolve_config_path(None) == Path("/etc/qwenspark.yaml")
    assert resolve_config_path("x.yaml") == Path("x.yaml")  # --config wins
    monkeypatch.delenv("QWENSPARK_CONFIG")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="QWENSPARK_CONFIG"):
        resolve_config_path(None)


def _cli(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "QWENSPARK_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "qwenspark.cli", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_outside_the_checkout(tmp_path: Path) -> None:
    # config-template works from any folder and prints conf/NAME.yaml, whose ${CONFIG_DIR}/../ (the checkout's .cache
    # and .run, above conf/) becomes ${CONFIG_DIR}/: a copy's paths are beside it, wherever it is kept.
    for name in TEMPLATES:
        out = _cli(["config-template", name], cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        shipped = (ROOT / "conf" / f"{name}.yaml").read_text(encoding="utf-8")
        assert out.stdout == shipped.replace("${CONFIG_DIR}/../", "${CONFIG_DIR}/")
    copy = tmp_path / "etc" / "my.yaml"
    copy.parent.mkdir()
    copy.write_text(_cli(["config-template", "local"], cwd=tmp_path).stdout, encoding="utf-8")
    assert load_config(copy).engine.model == str(tmp_path / "etc" / ".cache" / "models" / "qwen2.5-coder-0.5b-instruct")
    # No --config, no $QWENSPARK_CONFIG, no conf/local.yaml here: one clear error line, exit 2.
    out = _cli(["init-db"], cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qwenspark: error: no config"), out.stderr
    assert "qwenspark config-template local" in lines[0]
    # $QWENSPARK_CONFIG is read (a config with an unknown key: the error names the file from the env).
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  model: m\n  no_such_key: 1\n", encoding="utf-8")
    out = _cli(["init-db"], cwd=tmp_path, env={"QWENSPARK_CONFIG": str(bad)})
    assert out.returncode == 2
    assert out.stderr.startswith(f"qwenspark: error: invalid config {bad}: engine.no_such_key"), out.stderr
    # A missing --config file: the same kind of line.
    out = _cli(["init-db", "--config", "nope.yaml"], cwd=tmp_path)
    assert (out.returncode, out.stderr.startswith("qwenspark: error: cannot read config nope.yaml")) == (2, True)


def _has_build_backend() -> bool:
    """setuptools>=77 (pyproject's build requirement: SPDX `license`) in this environment."""
    try:
        major = int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return major >= 77


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (a stale build/ in the checkout must not leak into it)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copy2(ROOT / "pyproject.toml", src)
    shutil.copy2(ROOT / "README.md", src)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    # Links kept as links (the templates link into conf/), as in a checkout: the build must resolve them.
    shutil.copytree(ROOT / "qwenspark", src / "qwenspark", symlinks=True, ignore=junk)
    shutil.copytree(ROOT / "conf", src / "conf", ignore=junk)
    out = tmp_path_factory.mktemp("whl")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    if _has_build_backend():
        cmd.append("--no-build-isolation")  # offline: no setuptools download into an isolated build env
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("qwenspark-*.whl")
    return whl


def test_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"qwenspark/sql/schema.sql", "qwenspark/sql/upsert.sql", "qwenspark/sql/views.sql"} <= names
    for name in TEMPLATES:
        packaged = zipfile.ZipFile(wheel).read(f"qwenspark/templates/{name}.yaml")
        assert packaged == (ROOT / "conf" / f"{name}.yaml").read_bytes()
    assert "qwenspark/models/default.py" in names
    # The dashboard works offline: its page, script and ECharts (with the licence) are in the wheel.
    static = "qwenspark/dashboard/static/"
    assert {f"{static}index.html", f"{static}dashboard.js", f"{static}dashboard.css",
            f"{static}vendor/echarts-6.1.0.min.js", f"{static}vendor/ECHARTS-LICENSE",
            f"{static}vendor/ECHARTS-NOTICE"} <= names
    # Every prompt version's label head travels with the package (executors read it from there).
    from qwenspark.prompts import TEMPLATES as PROMPTS

    heads = {f"qwenspark/heads/{t.label_head}.npz" for t in PROMPTS.values() if t.label_head}
    assert heads and heads <= names
    assert not [n for n in names if "tiny" in n or n.startswith("tests/")], "test support code in the wheel"
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [
        line for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines() if line.startswith("Requires")
    ]
    assert "Requires-Dist: pyspark<4.4,>=4.2.0" in requires
    assert not [r for r in requires if "flash-attn" in r or "flash_attn" in r]


def test_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import sys, qwenspark\n"
        f"assert qwenspark.__file__.startswith({str(site)!r}), qwenspark.__file__\n"
        "from qwenspark.cli import main\n"
        "sys.exit(main(['config-template', 'cluster-gpu']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == (ROOT / "conf" / "cluster-gpu.yaml").read_text(encoding="utf-8")
