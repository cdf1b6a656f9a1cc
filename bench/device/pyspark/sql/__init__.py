"""Stand-in (bench/device/README.md): placeholders that fail when used."""

from typing import Any


class _Unavailable:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("pyspark stand-in: Spark is not on this machine (bench/device/README.md)")


class Column(_Unavailable):
    """Placeholder."""


class DataFrame(_Unavailable):
    """Placeholder."""


class SparkSession(_Unavailable):
    """Placeholder."""
