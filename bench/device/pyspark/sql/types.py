"""Stand-in (bench/device/README.md): schema objects that hold their fields, enough to build the project's schemas."""

from typing import Any


class DataType:
    """Any Spark type: constructible, comparable by class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.args == getattr(other, "args", None)

    def __hash__(self) -> int:
        return hash(type(self).__name__)


class StructField:
    def __init__(self, name: str, dataType: Any, nullable: bool = True, metadata: Any = None) -> None:
        self.name, self.dataType, self.nullable = name, dataType, nullable


class StructType(DataType):
    def __init__(self, fields: list[StructField] | None = None) -> None:
        super().__init__()
        self.fields = list(fields or [])

    def fieldNames(self) -> list[str]:
        return [f.name for f in self.fields]

    def __iter__(self) -> Any:
        return iter(self.fields)


def __getattr__(name: str) -> Any:
    if name.endswith("Type"):  # LongType, StringType, ArrayType, ...: one class each, made on first use
        cls = type(name, (DataType,), {})
        globals()[name] = cls
        return cls
    raise AttributeError(name)
