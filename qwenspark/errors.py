"""The exception tree: every error qwenspark raises on purpose is a QwenSparkError."""


class QwenSparkError(Exception):
    """Base class of qwenspark's own errors."""


class ConfigError(QwenSparkError):
    """The configuration is invalid; the message names the key."""


class SourceError(QwenSparkError):
    """Reading or validating the input reviews failed."""


class EngineError(QwenSparkError):
    """The inference engine failed as a whole (fatal for the task: Spark retries it)."""


class ParseError(QwenSparkError):
    """A completion is not a valid analysis record (per row: goes to the error column)."""


class SinkError(QwenSparkError):
    """Writing or reconciling the results failed; nothing was committed."""


class RequestError(QwenSparkError, ValueError):
    """The engine refused one request (e.g. prompt longer than the context): a per-row error, not fatal."""
