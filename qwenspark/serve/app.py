"""The HTTP service: POST /v1/analyze (JSON, or label-first NDJSON with ?stream=true), GET /healthz, GET /metrics.

Each request runs the batch job's executor-side rules (analyze.PreparedBatch: guard, token cap, prompt, grammar,
parsing, label head, repair) on its reviews and answers with the rows the job would store. Admission is bounded
(serve.max_queue reviews at once, 429 with Retry-After beyond it), every request has a deadline (504), and an API key
is required off loopback (the service refuses to start without one there).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import re
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from qwenspark.analyze import FAULT_RETRIES, AnalyzeSpec, PreparedBatch, templated
from qwenspark.clean import clean_lang, clean_text
from qwenspark.config import EngineConfig, QwenSparkConfig
from qwenspark.engines.base import Retry, refusal
from qwenspark.engines.dead_ends import DEAD_END
from qwenspark.errors import ConfigError, EngineError, RequestError
from qwenspark.models.identity import model_identity
from qwenspark.optimism import Optimism
from qwenspark.schemas import CLEAN_SCHEMA, HOTEL_ID_MAX_CHARS
from qwenspark.serve.engine import ServeEngine
from qwenspark.serve.pauses import Pauses, freeze_heap
from qwenspark.serve.sizing import engine_count, worker_count

log = logging.getLogger("qwenspark.serve")
LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
# Seconds an answer the engine ended in an error waits before it is generated again, times the faults so far (50, 100,
# 150 ms): its second attempt sent at once fell in the same burst of faults on an H100 (analyze.FAULT_RETRIES).
FAULT_PAUSE_S = 0.05
_INT64 = (-(2**63), 2**63 - 1)
_DECIMAL = re.compile(r"-?[0-9]{1,19}")  # ASCII digits only: str.isdigit would take "²" and other scripts' digits
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Service.warm's reviews: one for each language the prompts have (the language found from the text, as for a request
# that names none).
WARM_REVIEWS = ("The room was clean and the staff were friendly.", "房间干净，服务很好。")
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0)


class Refused(Exception):
    """A request answered with a 4xx/5xx status and a reason, before any work."""

    def __init__(self, status: int, reason: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, dict(headers or {})


def check_bind(host: str, key: object) -> None:
    """Off loopback the service needs an API key: refuse to start without one."""
    if host not in LOOPBACK and key is None:
        raise ConfigError(f"serve: binding {host} needs an API key (serve.api_key_env or serve.api_key_file); "
                          "without one only 127.0.0.1 / ::1 / localhost is allowed")


@dataclass(frozen=True)
class Review:
    """One review as a request names it (validated)."""

    text: str
    lang: str | None
    hotel_id: str | None
    review_id: int | None
    created_at: datetime | None


def read_reviews(body: bytes, max_reviews: int) -> list[Review]:
    """The reviews of a request body: one object, a list of them, or {"reviews": [...]}; Refused(400) otherwise."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise Refused(400, "body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise Refused(400, f"body is not JSON: {exc.msg} at {exc.pos}") from None
    if isinstance(payload, list):  # a bare list is what a client sending several reviews writes first
        items: object = payload
    else:
        items = payload.get("reviews") if isinstance(payload, dict) and "reviews" in payload else [payload]
    if not isinstance(items, list) or not items:
        raise Refused(400, "reviews: a non-empty list of objects")
    if len(items) > max_reviews:
        raise Refused(413, f"reviews: at most {max_reviews} per request (serve.max_reviews)")
    return [_review(item, n) for n, item in enumerate(items)]


def _review(item: object, n: int) -> Review:
    where = f"reviews[{n}]"
    if not isinstance(item, dict):
        raise Refused(400, f"{where}: an object with a text")
    unknown = sorted(set(item) - {"text", "lang", "hotel_id", "review_id", "created_at"})
    if unknown:
        raise Refused(400, f"{where}: unknown field(s) {unknown}")
    text, lang, hotel, rid, created = (item.get(k) for k in ("text", "lang", "hotel_id", "review_id", "created_at"))
    if not isinstance(text, str):
        raise Refused(400, f"{where}.text: a string is required")
    for name, value in (("text", text), ("lang", lang), ("hotel_id", hotel)):
        if isinstance(value, str) and not _unicode(value):
            raise Refused(400, f"{where}.{name}: not valid Unicode (a lone surrogate such as \\ud800)")
    if lang is not None and not isinstance(lang, str):
        raise Refused(400, f"{where}.lang: a string or null")
    if isinstance(hotel, int) and not isinstance(hotel, bool):
        hotel = str(hotel)  # numeric hotel ids are common: stored as their digits, as the VARCHAR column holds them
    if hotel is not None and (not isinstance(hotel, str) or len(hotel) > HOTEL_ID_MAX_CHARS):
        raise Refused(400, f"{where}.hotel_id: a string or integer of at most {HOTEL_ID_MAX_CHARS} characters, "
                      "or null")
    if isinstance(rid, str) and _DECIMAL.fullmatch(rid):
        rid = int(rid)  # as its decimal string: JavaScript's numbers lose a BIGINT id's last digits past 2**53
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, int) or not _INT64[0] <= rid <= _INT64[1]):
        raise Refused(400, f"{where}.review_id: a 64-bit integer (or its decimal string) or null")
    return Review(text, lang, hotel, rid, _timestamp(created, f"{where}.created_at"))


def _unicode(value: str) -> bool:
    """False for a string JSON's \\uXXXX escapes gave a lone surrogate: no UTF-8 for it, so nothing can store it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes limit bytes: a huge body is never held in memory."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"body larger than {limit} bytes (serve.max_body_bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refused(413, f"body larger than {limit} bytes (serve.max_body_bytes)")
    return bytes(body)


def _timestamp(value: object, where: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise Refused(400, f"{where}: an ISO 8601 time such as 2026-12-02T08:30:00Z, or null") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


class Metrics:
    """Prometheus figures of one service (its own registry): requests, latency, admission, engine tokens/s."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("qwenspark_serve_requests", "HTTP requests to /v1/analyze by status", ["code"],
                                registry=r)
        self.reviews = Counter("qwenspark_serve_reviews", "Reviews answered, by outcome", ["outcome"], registry=r)
        self.latency = Histogram("qwenspark_serve_request_seconds", "Time to the whole answer of a request",
                                 buckets=_BUCKETS, registry=r)
        self.label_latency = Histogram("qwenspark_serve_label_seconds", "Time to a review's label",
                                       buckets=_BUCKETS, registry=r)
        self.retries = Counter("qwenspark_serve_retries", "Answers generated again, by kind (grammar: an optimistic "
                               "answer that misfit; penalty: cut or looping; fault: ended by the engine in an error, "
                               "counted per attempt; borrowed: a summary repeating a few-shot example's)", ["kind"],
                               registry=r)
        self.dead_ends = Counter("qwenspark_serve_dead_ends", "Answers written without the grammar that were cut at "
                                 "their first dead end and generated again with it (engine.cut_dead_ends)",
                                 registry=r)
        self.guided_first = Counter("qwenspark_serve_guided_first", "Reviews guided from their first token because "
                                    "too few first answers fit the grammar (serve.optimistic_min_fit)", registry=r)
        self.fit_share = Gauge("qwenspark_serve_optimistic_fit_share", "Share of the last serve.optimistic_window "
                               "first answers written without the grammar that fit it", registry=r)
        self.in_flight = Gauge("qwenspark_serve_in_flight", "Reviews admitted and not yet answered", registry=r)
        self.queue_depth = Gauge("qwenspark_serve_queue_depth", "Admitted reviews the engine has not started "
                                 "answering", registry=r)
        self.tokens = Counter("qwenspark_serve_generated_tokens", "Output tokens the engine generated", registry=r)
        rate = Gauge("qwenspark_serve_tokens_per_second", "Output tokens per second over the last 10 s", registry=r)
        self._window: deque[tuple[float, int]] = deque()
        rate.set_function(self.tokens_per_second)
        self.pauses = Pauses(r)  # started by the serving process (serve_one): loop lag, collector pauses

    def generated(self, n: int) -> None:
        self.tokens.inc(n)
        self._window.append((time.monotonic(), n))

    def tokens_per_second(self) -> float:
        cutoff = time.monotonic() - 10.0
        while self._window and self._window[0][0] < cutoff:
            self._window.popleft()
        return sum(n for _, n in self._window) / 10.0


Stored = Callable[[pd.DataFrame], Awaitable[None]]


class Service:
    """The state the handlers share: engine, rules, admission, metrics and the optional store."""

    def __init__(self, cfg: QwenSparkConfig, engine: ServeEngine, *, store: Stored | None = None,
                 worker: int = 0) -> None:
        self.cfg, self.engine, self.store, self.worker = cfg, engine, store, worker
        self.spec = AnalyzeSpec(engine=cfg.engine, prompt_version=cfg.prompt.version,
                                max_review_tokens=cfg.clean.max_review_tokens, guard=cfg.prompt.guard,
                                aspect_evidence=cfg.prompt.aspect_evidence)
        # With an optimistic engine (first attempts may go unguided): the rule that decides it per request.
        self.optimism = Optimism(cfg.serve.optimistic_min_fit, cfg.serve.optimistic_window) \
            if serve_engine_config(cfg).optimistic else None
        self.key = cfg.serve.api_key()
        self.identity = model_identity(cfg.engine)
        self.metrics = Metrics()
        if (optimism := self.optimism) is not None:  # read when /metrics is, not per answer
            self.metrics.fit_share.set_function(lambda: optimism.share() or 0.0)
        self.admitted = 0
        self.fault_told = False  # the first answer the engine ends in an error is explained in the log, once

    def authorise(self, request: Request) -> None:
        if self.key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        expected = self.key.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected):
            raise Refused(401, "a valid API key is required (Authorization: Bearer KEY)",
                          {"WWW-Authenticate": "Bearer"})

    def input_key(self, lang: str | None, text: str) -> str:
        """clean.input_key in Python: sha256(model identity, prompt version, normalised lang, raw text)."""
        parts = [self.identity, self.cfg.prompt.version, lang or "", text]
        return hashlib.sha256("\u001f".join(parts).encode("utf-8")).hexdigest()

    def prepare(self, reviews: list[Review]) -> PreparedBatch:
        """The reviews as the executor gets them (clean's rules, in Python); Refused for what clean rejects."""
        rows = self._rows(reviews)
        optimistic = self.optimism.choose() if self.optimism is not None else False
        if self.optimism is not None and not optimistic:
            self.metrics.guided_first.inc(len(rows))
        batch = PreparedBatch(self.engine, pd.DataFrame(rows, columns=CLEAN_SCHEMA.fieldNames()), self.spec,
                              optimistic=optimistic, optimism=self.optimism)
        for i, error in enumerate(batch.errors):
            if error is not None:  # the guard left nothing but instructions to the model
                raise Refused(400, f"reviews[{i}].text: {error}")
        return batch

    def warm(self) -> list[str]:
        """Do before the first request what this process's first request would do on its own, and return the
        languages of the prompts it built: load the prompt version's label head and build a prompt per language
        (the chat template's compile, the tokenised text around a review). Done by the first request instead, it
        held that process's event loop 70-100 ms on this CPU with every request behind it waiting (each of
        serve.workers' processes does it; serve_history.md, stop 40). Nothing is generated, counted or stored."""
        rows = self._rows([Review(text, None, None, 0, None) for text in WARM_REVIEWS])
        batch = PreparedBatch(self.engine, pd.DataFrame(rows, columns=CLEAN_SCHEMA.fieldNames()), self.spec,
                              optimistic=False)
        prompts = getattr(self.engine, "prompts", None)  # vLLM's engines, own or shared, build token ids here
        langs = [batch.langs[i] for i in batch.todo]
        for j, i in enumerate(batch.todo):
            if prompts is not None:
                prompts.prompt(batch.conversations[j])
            if batch.head is not None:  # the head's first vote reads its language's features
                batch.head.label("positive", None, batch.texts[i], langs[j])
        return langs

    def _rows(self, reviews: list[Review]) -> list[dict[str, Any]]:
        """The clean stage's rows for the reviews; Refused for what clean rejects."""
        max_chars, rows = self.cfg.clean.max_chars, []
        for n, review in enumerate(reviews):
            if len(review.text) > max_chars:
                raise Refused(413, f"reviews[{n}].text: longer than {max_chars} characters (clean.max_chars)")
            text, error = clean_text(review.text, max_chars)
            if error is not None:
                raise Refused(400, f"reviews[{n}].text: {error}")
            if self.store is not None and review.review_id is None:
                raise Refused(400, f"reviews[{n}].review_id: required while serve.store is on")
            lang = clean_lang(review.lang)
            rows.append({
                "review_id": review.review_id if review.review_id is not None else n,
                "hotel_id": review.hotel_id,
                "created_at": None if review.created_at is None
                else (review.created_at - _EPOCH) // timedelta(microseconds=1),
                "lang": lang, "text": text, "input_key": self.input_key(lang, review.text), "clean_error": None,
            })
        return rows

    def admit(self, n: int) -> None:
        if self.admitted + n > self.cfg.serve.max_queue:
            raise Refused(429, f"busy: {self.admitted} reviews in progress (serve.max_queue "
                               f"{self.cfg.serve.max_queue}); retry shortly", {"Retry-After": "1"})
        self.admitted += n
        self.metrics.in_flight.set(self.admitted)
        self.metrics.queue_depth.inc(n)

    def release(self, n: int) -> None:
        self.admitted -= n
        self.metrics.in_flight.set(self.admitted)

    async def answer(self, batch: PreparedBatch, j: int, started: float,
                     label: Callable[[int, str], None] | None = None) -> None:
        """Conversation j to its stored answer: stream it, send its label as soon as it is decoded, repair it
        if the prompt version says so (batch.fill)."""
        waiting = [True]  # not yet started by the engine (queue_depth): until its first output, or its end
        try:
            await self._answer(batch, j, started, label, waiting)
        finally:
            if waiting[0]:
                self.metrics.queue_depth.dec()

    async def _answer(self, batch: PreparedBatch, j: int, started: float, label: Callable[[int, str], None] | None,
                      waiting: list[bool]) -> None:
        lang = batch.langs[batch.todo[j]]
        # An optimistic engine's first attempt is unguided; a request the share of fitting answers sends guided from
        # its first token asks for the grammar's settings, as a retry without a pin (batch.fill records the outcome
        # of an optimistic first attempt in the share).
        retry: Retry | None = batch.first_retry
        # Once the label is sent, a retry (an optimistic answer that misfits the grammar, a cut or looping one) is
        # pinned to the model label it was sent from, and the row keeps the label sent: what the client was told
        # is what is stored.
        pin = sent = None
        while True:
            done = None
            try:
                # read each attempt: a "borrowed" retry's prompt is rebuilt without the example (batch.fill)
                async for part in self.engine.stream(batch.conversations[j], lang, retry, pin):
                    if waiting[0]:
                        waiting[0] = False
                        self.metrics.queue_depth.dec()
                    if label is not None and (answer := batch.early_answer(part.text)) is not None:
                        sent = batch.early_label(j, answer, part.label_logprobs)
                        self.metrics.label_latency.observe(time.perf_counter() - started)
                        label(j, sent)
                        label, pin = None, answer
                    done = part.done
            except RequestError as exc:  # this review refused (e.g. longer than the context): its row's error
                batch.fill(j, refusal(exc), _ms(started))
                return
            if done is None:
                raise EngineError("serve: the engine ended a request without an answer")
            self.metrics.generated(done.tokens_out)
            if done.finish_reason == DEAD_END:
                self.metrics.dead_ends.inc()
            retry = batch.fill(j, done, _ms(started))
            if retry is None:
                if sent is not None:
                    batch.keep_label(j, sent)
                elif label is not None:  # an answer whose label is not its first field: sent with the rest
                    self.metrics.label_latency.observe(time.perf_counter() - started)
                return
            self.metrics.retries.labels(retry).inc()
            if retry == "fault":  # the engine's faults came in bursts of consecutive requests (analyze.FAULT_RETRIES)
                self._tell_fault()
                await asyncio.sleep(FAULT_PAUSE_S * batch.faults[j])

    def _tell_fault(self) -> None:
        # vLLM logs each such answer as an ERROR asking for an issue to be filed; say once what the service does.
        if not self.fault_told:
            self.fault_told = True
            log.warning("serve: the engine ended an answer in an error (vLLM: 'grammar rejected tokens'); such answers "
                        "are generated again, up to %d times, and counted in qwenspark_serve_retries_total"
                        "{kind=\"fault\"} (README, 'Labels and how they are scored')", FAULT_RETRIES)

    async def run(self, batch: PreparedBatch, started: float,
                  label: Callable[[int, str], None] | None = None) -> list[dict[str, Any]]:
        """Every review of the batch answered concurrently (the engine batches them), within the deadline."""
        try:
            async with asyncio.timeout(self.cfg.serve.request_timeout_s), asyncio.TaskGroup() as group:
                for j in range(len(batch.todo)):
                    group.create_task(self.answer(batch, j, started, label))
        except ExceptionGroup as failed:
            down = failed.subgroup(EngineError)
            if down is not None:  # an outage: the request fails (503), it never becomes error rows
                raise down.exceptions[0] from failed
            raise
        if self.store is not None:
            await self.store(batch.frame())
        rows = [_result(row) for row in batch.records()]
        for row in rows:
            self.metrics.reviews.labels("error" if row["error"] else "ok").inc()
        return rows


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)


def _result(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A stored result row as the response shows it (aspects as a list, no executor bookkeeping)."""
    keep = ("review_id", "hotel_id", "lang", "sentiment", "summary", "error", "truncated", "tokens_in", "tokens_out",
            "latency_ms", "model", "prompt_version", "input_key")
    out = {k: _plain(row[k]) for k in keep}
    out["aspects"] = json.loads(row["aspects"]) if isinstance(row["aspects"], str) else []
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


def create_app(service: Service, *, on_close: Callable[[], Awaitable[None]] | None = None) -> Starlette:
    """The Starlette application over a started service."""

    async def analyze(request: Request) -> Response:
        started = time.perf_counter()
        stream = request.query_params.get("stream", "").lower() in ("1", "true", "yes")
        try:
            service.authorise(request)
            body = await read_body(request, service.cfg.serve.max_body_bytes)
            batch = service.prepare(read_reviews(body, service.cfg.serve.max_reviews))
            service.admit(len(batch.todo))
        except Refused as exc:
            service.metrics.requests.labels(str(exc.status)).inc()
            return JSONResponse({"error": exc.reason}, status_code=exc.status, headers=exc.headers)
        if stream:
            return StreamingResponse(_events(service, batch, started), media_type="application/x-ndjson")
        try:
            results = await service.run(batch, started)
        except TimeoutError:
            return _failed(service, 504, f"no answer within {service.cfg.serve.request_timeout_s} s "
                                         "(serve.request_timeout_s)")
        except EngineError as exc:
            return _failed(service, 503, f"engine unavailable: {exc}")
        finally:
            service.release(len(batch.todo))
        service.metrics.latency.observe(time.perf_counter() - started)
        service.metrics.requests.labels("200").inc()
        return JSONResponse({"results": results})

    async def healthz(request: Request) -> Response:
        if not service.engine.alive():  # a load balancer stops sending here; the process is stopping (serve_one)
            return JSONResponse({"status": "engine down", "model": service.engine.model_name}, status_code=503)
        return JSONResponse({"status": "ok", "model": service.engine.model_name,
                             "prompt_version": service.cfg.prompt.version, "in_flight": service.admitted,
                             "worker": service.worker, "engines": getattr(service.engine, "engines", 1)})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if on_close is not None:
                await on_close()

    return Starlette(routes=[Route("/v1/analyze", analyze, methods=["POST"]), Route("/healthz", healthz),
                             Route("/metrics", metrics)], lifespan=lifespan)


def _failed(service: Service, status: int, reason: str) -> Response:
    service.metrics.requests.labels(str(status)).inc()
    return JSONResponse({"error": reason}, status_code=status)


async def _events(service: Service, batch: PreparedBatch, started: float) -> AsyncIterator[bytes]:
    """NDJSON lines: {"index", "sentiment"} as soon as each label is decoded, then {"index", "result"} per review at
    the end, or one {"error"} line (timeout, engine down)."""
    labels: asyncio.Queue[bytes] = asyncio.Queue()

    def label(j: int, sentiment: str) -> None:
        labels.put_nowait(_line({"index": batch.todo[j], "sentiment": sentiment,
                                 "label_ms": _ms(started)}))

    task = asyncio.create_task(service.run(batch, started, label))
    code = "200"
    try:
        while not task.done() or not labels.empty():
            getter = asyncio.ensure_future(labels.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
        try:
            for i, result in enumerate(task.result()):
                yield _line({"index": i, "result": result})
            service.metrics.latency.observe(time.perf_counter() - started)
        except TimeoutError:
            code = "504"
            yield _line({"error": f"no answer within {service.cfg.serve.request_timeout_s} s"})
        except EngineError as exc:
            code = "503"
            yield _line({"error": f"engine unavailable: {exc}"})
    finally:
        if not task.done():  # the client went away: stop its requests in the engine
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task
        service.release(len(batch.todo))
        service.metrics.requests.labels(code).inc()


def _line(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8")


def serve_engine_config(cfg: QwenSparkConfig) -> EngineConfig:
    """The service's engine settings: the prompt version's; with serve.optimistic off, every answer guided from its
    first token."""
    engine = templated(cfg.engine, cfg.prompt.version)
    return engine if cfg.serve.optimistic else engine.model_copy(update={"optimistic": False})


def serve(cfg: QwenSparkConfig, host: str | None = None, port: int | None = None) -> None:
    """Load the engine and serve until interrupted (`qwenspark serve`); with serve.workers > 1, that many processes
    on the one port (qwenspark.serve.workers)."""
    host, port = host or cfg.serve.host, port or cfg.serve.port
    check_bind(host, cfg.serve.api_key())
    workers, engines = worker_count(cfg), engine_count(cfg)
    if workers > 1 or engines > 1:  # several engines are held by the workers' host, even for one worker
        from qwenspark.serve.workers import supervise

        sized = cfg.serve.model_copy(update={"workers": workers, "engines": engines})
        supervise(cfg.model_copy(update={"serve": sized}), host, port)
        return
    serve_one(cfg, host, port)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (the `serve` extra), as uvicorn on its own and vLLM's server run;
    else Python's. Its sockets and callbacks run in C: measured here 2.87 against 3.03 ms of the service's CPU a
    request, medians of 3 interleaved runs each (bench/results/serve_instant_cpu_uvloop.json): the rest is Python."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def serve_one(cfg: QwenSparkConfig, host: str, port: int, *, sock: socket.socket | None = None, worker: int = 0,
              ready: Callable[[], None] | None = None, engine_path: Path | None = None) -> None:
    """One service process: its engine (or, given engine_path, the shared engine's socket: qwenspark.serve.shared),
    its HTTP server (on sock when given: a worker's port-sharing socket); ready is called once both are up."""
    import uvicorn

    from qwenspark.serve.engine import start_engine

    engine_cfg = serve_engine_config(cfg)
    running: list[uvicorn.Server] = []
    lost: list[bool] = []  # the engine (or the shared engine's host) is gone: stop serving and fail

    def on_lost() -> None:
        lost.append(True)
        for server in running:
            server.should_exit = True

    async def main() -> None:
        from qwenspark.serve.shared import SharedVllm
        from qwenspark.serve.store import Store

        started: ServeEngine = await (SharedVllm.connect(engine_path, on_lost) if engine_path is not None
                                      else start_engine(engine_cfg))
        writer = Store(cfg) if cfg.serve.store else None
        if writer is not None:
            await writer.start()
        service = Service(cfg, started, store=writer.put if writer is not None else None, worker=worker)
        began = time.perf_counter()
        langs = service.warm()
        log.info("serve: prompts built for %s in %.0f ms before the first request", ", ".join(langs),
                 (time.perf_counter() - began) * 1000)

        service.metrics.pauses.start()

        async def close() -> None:
            await service.metrics.pauses.stop()
            if writer is not None:
                await writer.stop()
            await started.close()

        app = create_app(service, on_close=close)
        freeze_heap()
        log.info("serving %s (prompt %s) on http://%s:%d%s", started.model_name, cfg.prompt.version, host, port,
                 f" (worker {worker})" if sock is not None else "")
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        running.append(server)
        watching = asyncio.create_task(watch(started))
        serving = asyncio.create_task(server.serve(sockets=[sock] if sock is not None else None))
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started and ready is not None:
            ready()
        await serving
        watching.cancel()

    async def watch(engine: ServeEngine) -> None:
        # An engine whose process died answers nothing again: stop and exit non-zero, for the operator's restart,
        # rather than serve 503s from a process that looks up.
        while engine.alive():
            await asyncio.sleep(1.0)
        log.error("serve: the engine died; stopping")
        on_lost()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())
    if lost:
        raise EngineError("serve: the engine is gone (see the log above)")
