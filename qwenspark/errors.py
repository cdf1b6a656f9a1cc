"""The exception tree, and the one mapping of database, JDBC and Spark failures onto it (config or runtime)."""

from __future__ import annotations

import re
from typing import Any, Protocol


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


class DatabaseError(QwenSparkError):
    """The database cannot be reached or the connection was lost: a runtime failure, rerun once it is back."""


class DbTarget(Protocol):
    """What the messages name of a database config (config.DbConfig; a Protocol: config imports this module)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def user(self) -> str: ...

    @property
    def database(self) -> str: ...

    @property
    def user_key(self) -> str: ...

    def password_source(self) -> str: ...


# MySQL/MariaDB error numbers (client 2xxx, server 1xxx), grouped by what the user does about them.
CANNOT_CONNECT = frozenset({2002, 2003})  # no server at that address (down, wrong port, firewall)
CONNECTION_LOST = frozenset({1053, 1927, 2006, 2013, 2055, 4031})  # shutdown, killed, gone away, lost
UNKNOWN_HOST = 2005
LOGIN_REFUSED = 1045
HOST_NOT_ALLOWED = 1130
DATABASE_DENIED = 1044
UNKNOWN_DATABASE = 1049
PRIVILEGE_DENIED = frozenset({1142, 1143, 1227, 1370})  # table, column, global, routine privilege missing
NO_SUCH_TABLE = 1146


def _at(db: DbTarget | None) -> str:
    return f"{db.host}:{db.port} (db.host, db.port)" if db else "the configured address (db.host, db.port)"


def _user(db: DbTarget | None) -> str:
    return f"{db.user!r} ({db.user_key})" if db else "db.user"


def _database(db: DbTarget | None) -> str:
    return f"{db.database!r} (db.database)" if db else "db.database"


def _config_error(errno: int, message: str, db: DbTarget | None) -> ConfigError | None:
    """The errors the user fixes in the config or in the database's grants; None for the others."""
    if errno == UNKNOWN_HOST:
        return ConfigError(f"unknown database host {db.host if db else ''!r} (db.host): {message}")
    if errno == LOGIN_REFUSED:
        source = db.password_source() if db else "db.password_env or db.password_file"
        return ConfigError(
            f"the database refused the login of user {_user(db)} with the password from {source}: "
            f"check that password and {db.user_key if db else 'db.user'} ({message})"
        )
    if errno == HOST_NOT_ALLOWED:
        return ConfigError(f"user {_user(db)} may not connect from this host to {_at(db)}: {message}")
    if errno == UNKNOWN_DATABASE:
        return ConfigError(f"database {_database(db)} does not exist on {_at(db)}: {message}")
    if errno == DATABASE_DENIED or errno in PRIVILEGE_DENIED:
        return ConfigError(
            f"user {_user(db)} lacks a privilege the job needs: {message}; grant it on database {_database(db)}"
        )
    if errno == NO_SUCH_TABLE:
        return ConfigError(f"{message}: check source.table, or create the tables with `qwenspark init-db`")
    return None


def db_error(
    errno: int | None, message: str, db: DbTarget | None = None, sqlstate: str | None = None
) -> QwenSparkError:
    """The error to raise for a database failure: ConfigError (the user must change a setting or a grant) or
    DatabaseError (runtime), its one-line message naming the cause and the setting. Never holds the password.

    errno: mysql.connector's `exc.errno`, or a JDBC SQLException's getErrorCode(); sqlstate decides when errno is
    0 or None (JDBC connection failures carry SQLState 08xxx and no server error number).
    """
    message = one_line(message)
    if errno is not None and errno <= 0:  # JDBC drivers' "no server error number" (0, -1)
        errno = None
    if not errno and sqlstate and sqlstate.startswith("08"):  # SQL's connection exception class
        return DatabaseError(f"the connection to the database at {_at(db)} failed: {message}")
    if not errno and sqlstate and sqlstate.startswith("28"):  # invalid authorization
        errno = LOGIN_REFUSED
    if errno in CANNOT_CONNECT:
        return DatabaseError(f"cannot connect to the database at {_at(db)}: {message}")
    if errno in CONNECTION_LOST:
        return DatabaseError(f"lost the connection to the database at {_at(db)}: {message}")
    if errno:
        config = _config_error(errno, message, db)
        if config is not None:
            return config
    return DatabaseError(f"database error{f' {errno}' if errno else ''} at {_at(db)}: {message}")


def from_mysql(exc: BaseException, db: DbTarget | None = None) -> QwenSparkError:
    """db_error for a mysql.connector.Error: what io/mysql.py's callers raise (`raise from_mysql(exc, cfg.db)`)."""
    errno = getattr(exc, "errno", None)
    message = getattr(exc, "msg", None) or str(exc)
    return db_error(errno if isinstance(errno, int) else None, message, db, getattr(exc, "sqlstate", None))


def one_line(text: object, limit: int = 800) -> str:
    """text on one line (whitespace runs, newlines included, become one space), cut to limit characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _is_mysql_error(exc: BaseException) -> bool:
    # By module, so that this module does not import mysql.connector (nor the driver's import time).
    return type(exc).__module__.startswith("mysql.connector") and hasattr(exc, "errno")


def as_qwenspark_error(exc: BaseException, db: DbTarget | None = None) -> QwenSparkError:
    """Any failure as a QwenSparkError with a one-line message: ours as they are, database errors through
    db_error, a Py4J/PySpark error through the root cause in its Java cause chain, anything else as runtime."""
    for link in _python_chain(exc):
        if isinstance(link, QwenSparkError):
            return link
        if _is_mysql_error(link):
            return from_mysql(link, db)
    java = _from_java(exc, db)
    if java is not None:
        return java
    return QwenSparkError(f"unexpected error: {type(exc).__name__}: {one_line(exc)}")


def _python_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain and len(chain) < 16:
        chain.append(link)
        link = link.__cause__ or link.__context__
    return chain


def _java_throwables(exc: BaseException) -> list[Any]:
    """The Java exception behind a Py4JJavaError or a PySpark CapturedException, then its causes (outermost first)."""
    throwable = getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)
    chain: list[Any] = []
    try:
        while throwable is not None and len(chain) < 16:
            chain.append(throwable)
            throwable = throwable.getCause()
    except Exception:  # the JVM may be gone by now: keep what was read, the text fallback covers the rest
        pass
    return chain


def _java_class_names(throwable: Any) -> list[str]:
    """The throwable's class name, then its superclasses' (py4j: no isinstance across the bridge)."""
    names: list[str] = []
    cls = throwable.getClass()
    while cls is not None and len(names) < 16:
        names.append(str(cls.getName()))
        cls = cls.getSuperclass()
    return names


def _from_java(exc: BaseException, db: DbTarget | None) -> QwenSparkError | None:
    try:
        chain = _java_throwables(exc)
        for throwable in reversed(chain):  # the deepest cause says most
            names = _java_class_names(throwable)
            message = str(throwable.getMessage() or "")
            if "java.sql.SQLException" in names:
                return db_error(int(throwable.getErrorCode()), message, db, str(throwable.getSQLState() or ""))
            if "java.lang.ClassNotFoundException" in names:
                return _driver_missing(message)
        if chain:
            root = chain[-1]
            return QwenSparkError(f"{root.getClass().getName()}: {one_line(root.getMessage() or '')}")
    except Exception:  # py4j calls failed (JVM gone): read the text instead
        pass
    return _from_java_text(exc, db)


def _driver_missing(message: str) -> ConfigError:
    return ConfigError(
        f"JDBC driver class not found ({one_line(message)}): pass its jar with spark-submit --jars, or set "
        "db.jdbc_jar to it (db.jdbc_driver names the class)"
    )


# A Java stack trace's exception lines: "java.sql.SQLNonTransientConnectionException: (conn=7) message".
_JAVA_LINE = re.compile(r"^(?:Caused by: )?((?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)): ?(.*)$", re.M)


def _from_java_text(exc: BaseException, db: DbTarget | None) -> QwenSparkError | None:
    """The same mapping from the text of a Java stack trace, when its objects cannot be read through py4j."""
    if not hasattr(exc, "java_exception") and not hasattr(exc, "_origin"):
        return None
    lines = _JAVA_LINE.findall(str(exc))
    if not lines:
        return None
    sql = [(name, msg) for name, msg in lines if name.startswith("java.sql.") or ".jdbc." in name]
    if sql:
        name, message = sql[-1]
        state = "08" if "Connection" in name else "28" if "InvalidAuthorization" in name else None
        return db_error(None, message, db, state)
    name, message = lines[-1]
    if name == "java.lang.ClassNotFoundException":
        return _driver_missing(message)
    return QwenSparkError(f"{name}: {one_line(message)}")
