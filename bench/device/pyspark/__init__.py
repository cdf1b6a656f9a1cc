"""Stand-in for pyspark on a machine without Spark (bench/device/README.md): only what the executor path imports."""


class TaskContext:
    """Outside a Spark task: get() is None, as pyspark's own is."""

    @classmethod
    def get(cls) -> None:
        return None
