"""Stand-in (bench/device/README.md): every Spark function fails when called."""

from typing import Any


def __getattr__(name: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"pyspark stand-in: functions.{name} needs Spark (bench/device/README.md)")

    return unavailable
