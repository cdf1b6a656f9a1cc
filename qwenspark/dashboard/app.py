"""The dashboard web app: one page, its static files and a JSON API over the v_dash_* views (read-only account)."""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from pathlib import Path
from typing import Any

import mysql.connector
from mysql.connector.abstracts import MySQLConnectionAbstract
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from qwenspark.config import DbConfig, QwenSparkConfig
from qwenspark.dashboard import queries
from qwenspark.dashboard.queries import BadRequest, Filters, NotFound

log = logging.getLogger("qwenspark.dashboard")
STATIC = Path(__file__).parent / "static"
# Headers on every response: no script but the page's own files (ECharts sets inline styles), no sniffing, no
# referrer leaving the wall display.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                                 b"img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class Unavailable(RuntimeError):
    """The database cannot be reached or is busy (HTTP 503)."""


class Pool:
    """At most `size` open connections of the dashboard's account, read-only sessions in UTC, reused LIFO."""

    def __init__(self, db: DbConfig, size: int) -> None:
        self.db, self._idle = db, queue.LifoQueue[MySQLConnectionAbstract]()
        self._slots = threading.BoundedSemaphore(size)

    def _open(self) -> MySQLConnectionAbstract:
        conn = mysql.connector.connect(
            host=self.db.host, port=self.db.port, user=self.db.user, database=self.db.database,
            password=self.db.password().get_secret_value(),  # read per connection: a rotated file takes effect
            charset="utf8mb4", collation="utf8mb4_unicode_ci", autocommit=True, time_zone="+00:00",
            connection_timeout=5, use_pure=True,
        )
        with conn.cursor() as cur:
            # Defence in depth beside the grants: this session cannot write even if the role could.
            cur.execute("SET SESSION TRANSACTION READ ONLY")
        return conn  # type: ignore[return-value]

    @contextmanager
    def connection(self) -> Iterator[MySQLConnectionAbstract]:
        """A connection for one query; one that failed is closed, not put back."""
        if not self._slots.acquire(timeout=10):
            raise Unavailable("all database connections are busy")
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = self._open()
            try:
                yield conn
            except BaseException:
                with suppress(mysql.connector.Error):
                    conn.close()
                raise
            self._idle.put(conn)
        finally:
            self._slots.release()

    def fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        """Rows of one parameterised query as dicts; a connection the server dropped is replaced once."""
        for attempt in (1, 2):
            try:
                with self.connection() as conn, conn.cursor(dictionary=True) as cur:
                    cur.execute(sql, tuple(params))
                    return list(cur.fetchall())  # type: ignore[arg-type]
            except mysql.connector.Error as exc:
                # Lost or refused connections (client errors 2000-2999, operational errors): one retry on a new
                # connection; an SQL error (a grant, a missing view) is not retried.
                gone = isinstance(exc, mysql.connector.errors.OperationalError | mysql.connector.errors.InterfaceError)
                if not (gone or 2000 <= (exc.errno or 0) < 3000):
                    raise
                if attempt == 2:
                    raise Unavailable(f"database unavailable ({exc.errno})") from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the idle connections."""
        while not self._idle.empty():
            with suppress(queue.Empty, mysql.connector.Error):
                self._idle.get_nowait().close()


def _json(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, ensure_ascii=False, default=str, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})


def _error(status: int, message: str) -> Response:
    return _json({"error": message, "status": status}, status)


def create_app(cfg: QwenSparkConfig, pool: Pool | None = None) -> Starlette:
    """The app for cfg: the page at /, the API under /api, as db.dashboard_user."""
    pool = pool or Pool(cfg.db.dashboard(), cfg.dashboard.pool_size)
    fetch, dash = pool.fetch, cfg.dashboard

    def filters(request: Request) -> Filters:
        f = queries.parse_filters(dict(request.query_params), queries.bounds(fetch), dash.default_days)
        queries.require_hotel(fetch, f.hotel)
        return f

    def api(build: Callable[[Request], Any]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            try:
                response = _json(build(request))
            except BadRequest as exc:
                response = _error(400, str(exc))
            except NotFound as exc:
                response = _error(404, str(exc))
            except (Unavailable, mysql.connector.Error) as exc:
                # errno only: a server message may quote the statement; never a traceback to the client.
                log.warning("%s: %s", request.url.path, exc.__class__.__name__)
                response = _error(503, "database unavailable" if isinstance(exc, Unavailable) else "database error")
            except Exception:
                log.exception("%s failed", request.url.path)
                response = _error(500, "internal error")
            response.headers["server-timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
            return response
        return endpoint

    def meta(request: Request) -> dict[str, Any]:
        if request.query_params:
            raise BadRequest("meta takes no parameters")
        first, last = queries.bounds(fetch)
        end = last or dt.datetime.now(dt.UTC).date()
        return {"first_day": first, "last_day": last,
                "default_from": queries.default_start((first, last), end, dash.default_days), "default_to": end,
                "poll_seconds": dash.poll_seconds, "top_hotels": dash.top_hotels, "review_url": dash.review_url,
                "server_time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}

    def one_review(request: Request) -> dict[str, Any]:
        return queries.review(fetch, request.path_params["review_id"])

    def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})

    routes = [
        Route("/", page),
        Route("/api/meta", api(meta)),
        Route("/api/mix", api(lambda r: queries.mix(fetch, filters(r)))),
        Route("/api/trend", api(lambda r: queries.trend(fetch, filters(r)))),
        Route("/api/ranking", api(lambda r: queries.ranking(fetch, filters(r), dash.top_hotels))),
        Route("/api/heatmap", api(lambda r: queries.heatmap(fetch, filters(r), dash.top_hotels))),
        Route("/api/reviews", api(lambda r: queries.latest_reviews(fetch, filters(r), dash.latest_reviews))),
        Route("/api/runs", api(lambda r: queries.runs(fetch))),
        Route("/api/review/{review_id}", api(one_review)),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, "not found")

    async def server_error(request: Request, exc: Exception) -> Response:
        return _error(500, "internal error")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        pool.close()

    app = Starlette(routes=routes, exception_handlers={404: not_found, 500: server_error}, lifespan=lifespan)
    app.add_middleware(_SecurityHeaders)
    return app


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class _SecurityHeaders:
    """ASGI middleware adding SECURITY_HEADERS to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def serve(cfg: QwenSparkConfig, host: str | None = None, port: int | None = None) -> None:
    """Check the dashboard's login, then serve until interrupted."""
    import uvicorn

    host, port = host or cfg.dashboard.host, port or cfg.dashboard.port
    pool = Pool(cfg.db.dashboard(), cfg.dashboard.pool_size)
    pool.fetch("SELECT 1 AS ok FROM v_dash_runs LIMIT 1", [])  # a wrong password or grant fails here, not per chart
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("dashboard bound to %s: the page has no login; put it behind your proxy's authentication", host)
    log.warning("dashboard on http://%s:%d (as %s; Ctrl-C stops it)", host if ":" not in host else f"[{host}]", port,
                cfg.db.dashboard_user)
    uvicorn.run(create_app(cfg, pool), host=host, port=port, log_level="warning", access_log=False)
