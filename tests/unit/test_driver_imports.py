"""Importing qwenspark on the driver must not pull in torch, vllm or transformers."""

import subprocess
import sys

DRIVER_MODULES = [
    "qwenspark",
    "qwenspark.cli",
    "qwenspark.pipeline",
    "qwenspark.analyze",
    "qwenspark.evaluate",
    "qwenspark.report",
    "qwenspark.engines",
    "qwenspark.engines.cache",
    "qwenspark.models.default",
    "qwenspark.api",
]


def test_driver_import_is_light() -> None:
    code = (
        "import sys\n"
        f"for m in {DRIVER_MODULES!r}: __import__(m)\n"
        "heavy = sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"driver imports pulled in: {out.stdout.strip()}"


def test_the_public_api_is_importable_from_the_package_and_costs_nothing_until_used() -> None:
    code = (
        "import sys, qwenspark\n"
        "before = 'pyspark' in sys.modules\n"
        "from qwenspark import analyze_reviews, qwen_analyze, register, ANALYSIS_SCHEMA\n"
        "heavy = sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules)\n"
        "print(before, analyze_reviews.__module__, ','.join(heavy) or '-', [f.name for f in ANALYSIS_SCHEMA])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 3)[:3] == ["False", "qwenspark.api", "-"], out.stdout
    assert "'sentiment', 'summary', 'aspects', 'error', 'truncated', 'tokens_in', 'tokens_out'" in out.stdout
