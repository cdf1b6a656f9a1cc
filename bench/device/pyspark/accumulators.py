"""Stand-in (bench/device/README.md)."""

from typing import Generic, TypeVar

T = TypeVar("T")


class AccumulatorParam(Generic[T]):
    """Base class only: metrics are not collected without Spark."""
