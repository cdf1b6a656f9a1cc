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
