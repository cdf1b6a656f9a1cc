"""Fixtures of the reliability suite: the Spark suite's configs (echo engine, tiny model) on the session MariaDB."""

from __future__ import annotations

from tests.spark.conftest import echo_cfg, tiny_cfg  # noqa: F401  (fixtures re-exported for this folder)
