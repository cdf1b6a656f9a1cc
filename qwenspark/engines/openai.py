"""OpenAI-compatible HTTP engine (`vllm serve`, hosted Qwen endpoints): bounded, retried chat completions."""

from __future__ import annotations

import email.utils
import logging
import os
import random
import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

import httpx

from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message, Retry, attempt_settings
from qwenspark.errors import ConfigError, EngineError
from qwenspark.parse import answer_grammars

log = logging.getLogger(__name__)

# Completion.finish_reason of a row whose request the server refused for its content; parse.parse_completion
# turns it into the row's error ("engine: <reason>"). A Completion has no error field and base.py is shared by
# every engine.
ERROR_PREFIX = "error: "

# A server's Retry-After is honoured, but a broken one must not park a task for hours.
_RETRY_AFTER_MAX_S = 600.0
_ERR_MAX = 300

# Statuses that are about this request's content (400: prompt too long or a value the server rejects, 413: body
# too large, 422: unprocessable): the same server answers the other rows, so only this row fails.
_ROW_STATUSES = frozenset({400, 413, 422})


def _retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return min(max(seconds, 0.0), _RETRY_AFTER_MAX_S)


def _server_message(resp: httpx.Response) -> str:
    """The error message of an OpenAI-style error body ({"error": {"message": ...}}), else the raw text."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:_ERR_MAX]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:_ERR_MAX]
        if isinstance(err, str):
            return err[:_ERR_MAX]
        if body.get("message"):
            return str(body["message"])[:_ERR_MAX]
    return resp.text[:_ERR_MAX]


def _retryable(status: int) -> bool:
    # 408 is the server's own timeout, 429 its rate limit, 5xx its failure: the next attempt may succeed.
    return status in (408, 429) or status >= 500


def _error(reason: str) -> Completion:
    return Completion(text="", finish_reason=ERROR_PREFIX + reason, tokens_in=0, tokens_out=0)


@dataclass(frozen=True)
class _Failure:
    """One attempt that got no usable answer, and not for its row's content."""

    reason: str  # names the setting to check; never the API key
    retryable: bool
    retry_after: float | None = None


class _Call:
    """One generate() call: the abort signal its requests share and the first fatal failure."""

    def __init__(self) -> None:
        self.abort = threading.Event()
        self.fatal: str | None = None
        self._lock = threading.Lock()

    def fail(self, message: str) -> None:
        """Record the call's fatal failure (the first one wins) and stop its other requests."""
        with self._lock:
            if self.fatal is None:
                self.fatal = message
        self.abort.set()


class OpenAIEngine:
    """Chat completions from an OpenAI-compatible server, one POST per conversation, up to
    `max_concurrency` in flight.

    Two kinds of failure, kept apart so that an outage never turns into a night of stored error rows:
    - the row's content (HTTP 400/413/422, e.g. a prompt too long; or a 200 whose body is not a chat
      completion): that row comes back as `Completion(text="", finish_reason="error: <reason>", 0, 0)`,
      which parse.parse_completion reports as the row's error; the other rows keep their results.
    - the server or the setup (connection refused, 401/403 bad key, 404 unknown model or wrong base_url, any
      other unexpected status; or 408/429/5xx/timeouts still failing after `max_retries` retries): generate()
      raises EngineError naming the setting to check, and the call's other requests stop at once. The task
      fails and Spark retries it; the engine stays usable for the next call (the server may be back).

    encode/decode use the local tokenizer `cfg.tokenizer` when set; otherwise a token is one character
    (Unicode code point), so `clean.max_review_tokens` then truncates by characters.
    """

    def __init__(self, cfg: EngineConfig, *, backoff_base_s: float = 0.5, backoff_max_s: float = 30.0) -> None:
        if not cfg.base_url:
            raise ConfigError("engine.base_url: required when engine.kind=openai (e.g. http://127.0.0.1:8000/v1)")
        self.model_name = cfg.model
        self._cfg = cfg
        self._url = cfg.base_url.rstrip("/") + "/chat/completions"
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        headers = {"Content-Type": "application/json"}
        # The key comes from the environment only (never config values or argv) and is never logged; kept here
        # only to scrub it from server messages that echo it.
        self._api_key = os.environ.get(cfg.api_key_env) or None
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(cfg.request_timeout_s),
            # As many connections as requests in flight, so no request waits for a pooled connection.
            limits=httpx.Limits(max_connections=cfg.max_concurrency, max_keepalive_connections=cfg.max_concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_concurrency, thread_name_prefix="qwenspark-openai")
        self._body: dict[str, Any] = {
            "model": cfg.model,
            "temperature": cfg.temperature,
            "frequency_penalty": cfg.frequency_penalty,
            "seed": cfg.seed,
            "max_tokens": cfg.max_tokens,
        }
        # The response format by review language (engine.summary_script), None: any language.
        self._formats: dict[str | None, dict[str, Any]] = {}
        if cfg.guided:
            if cfg.answer_format != "json":  # the OpenAI API's response_format carries JSON schemas only
                raise ConfigError(
                    f"engine.kind openai: answers in {cfg.answer_format} (prompt.version v13) need a grammar the "
                    "OpenAI API cannot carry; choose a JSON prompt version (v11 is v13's JSON twin) or engine.guided: "
                    "false"
                )
            self._formats = {
                lang: {"type": "json_schema",
                       "json_schema": {"name": "review_analysis", "strict": True, "schema": grammar["json"]}}
                for lang, grammar in answer_grammars(cfg).items()
            }
        self._tokenizer: Any = None
        if cfg.tokenizer:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise EngineError(
                    "engine.tokenizer with engine.kind=openai needs transformers (the `hf` extra)"
                ) from exc
            self._tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer)
        self._closed = threading.Event()
        self._calls: set[_Call] = set()
        self._calls_lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            return [ord(ch) for ch in text]
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if self._tokenizer is None:
            return "".join(chr(i) for i in ids)
        return str(self._tokenizer.decode(list(ids)))

    def generate(
        self, conversations: Sequence[Sequence[Message]], langs: Sequence[str] | None = None, *,
        retry: Retry | None = None,
    ) -> list[Completion]:
        """One completion per conversation, in order; raises EngineError if the server or the setup failed."""
        if self._closed.is_set():
            raise EngineError("openai engine is closed")
        call = _Call()
        with self._calls_lock:
            self._calls.add(call)
        try:
            # map() keeps the input order; the pool's size is the bound on requests in flight.
            results = list(self._pool.map(partial(self._request, call, retry), range(len(conversations)),
                                          conversations, langs or [None] * len(conversations)))
        except CancelledError as exc:  # close() dropped the requests still queued
            raise EngineError("openai engine was closed during the call") from exc
        finally:
            with self._calls_lock:
                self._calls.discard(call)
        if call.fatal is not None:
            raise EngineError(call.fatal)
        done = [r for r in results if r is not None]
        if len(done) != len(results):  # only an abort leaves a request unanswered, and every abort sets fatal
            raise EngineError("openai engine: requests left unanswered")
        return done

    def _request(self, call: _Call, retry: Retry | None, index: int, conversation: Sequence[Message],
                 lang: str | None) -> Completion | None:
        """One conversation through the retry loop: its completion (or row error), or None once the call failed."""
        cfg = self._cfg
        guided, penalty = attempt_settings(cfg.optimistic, cfg.frequency_penalty, cfg.repair_penalty, retry)
        body = {**self._body, "messages": list(conversation), "frequency_penalty": penalty}
        if self._formats and guided:
            body["response_format"] = self._formats.get(lang, self._formats[None])
        attempt = 0
        while not call.abort.is_set():
            outcome = self._attempt(body)
            if isinstance(outcome, Completion):
                return outcome
            if not outcome.retryable or attempt >= self._cfg.max_retries:
                call.fail(self._fatal_message(outcome, attempt + 1))
                return None
            delay = outcome.retry_after if outcome.retry_after is not None else self._backoff(attempt)
            attempt += 1
            log.warning(
                "request %d to %s failed (%s); retry %d/%d in %.2f s",
                index,
                self._url,
                outcome.reason,
                attempt,
                self._cfg.max_retries,
                delay,
            )
            # Woken early when another request of the call failed for good, or by close().
            call.abort.wait(delay)
        return None

    def _attempt(self, body: dict[str, Any]) -> Completion | _Failure:
        """One POST: a completion, a row error (the request's content), or a failure of the server or setup."""
        where = f"engine.base_url={self._cfg.base_url}"
        try:
            resp = self._client.post(self._url, json=body)
        except httpx.TimeoutException as exc:
            return _Failure(
                f"no answer within engine.request_timeout_s={self._cfg.request_timeout_s:g} s from {where}"
                f" ({type(exc).__name__})",
                retryable=True,
            )
        except httpx.TransportError as exc:
            # Connection refused or reset, DNS: the server may be restarting, so retried before failing the task.
            return _Failure(self._scrub(f"cannot reach {where}: {type(exc).__name__}: {exc}")[:_ERR_MAX], True)
        status = resp.status_code
        if status == 200:
            return self._completion(resp)
        message = self._scrub(_server_message(resp))
        if status in _ROW_STATUSES:
            return _error(f"HTTP {status}: {message}")
        retryable = _retryable(status)
        retry_after = _retry_after_s(resp.headers.get("Retry-After")) if retryable else None
        return _Failure(f"HTTP {status} from {self._url}: {message}; {self._hint(status)}", retryable, retry_after)

    def _hint(self, status: int) -> str:
        """Which setting to check for an HTTP status that fails the task."""
        cfg = self._cfg
        if status in (401, 403):
            state = "set" if self._api_key else "not set"
            return f"check the API key in the environment variable engine.api_key_env={cfg.api_key_env} ({state})"
        if status == 404:
            return f"check engine.model={cfg.model} and engine.base_url={cfg.base_url} (the API root, up to /v1)"
        if status == 429:
            return f"the server kept rate-limiting: lower engine.max_concurrency={cfg.max_concurrency}"
        if _retryable(status):
            return f"the server at engine.base_url={cfg.base_url} kept failing"
        return f"not an answer a chat completions endpoint gives: check engine.base_url={cfg.base_url}"

    def _fatal_message(self, failure: _Failure, attempts: int) -> str:
        tries = f" (gave up after {attempts} attempts)" if attempts > 1 else ""
        return f"openai engine: {failure.reason}{tries}"

    def _scrub(self, text: str) -> str:
        # Some servers echo the key they were sent; error rows and exceptions end up in tables and logs.
        return text.replace(self._api_key, "***") if self._api_key else text

    def _backoff(self, attempt: int) -> float:
        # Exponential with "equal jitter" (half fixed, half random): spread-out retries of many rows that
        # failed together, yet never much shorter than the exponential step.
        step = min(self._backoff_max_s, self._backoff_base_s * 2.0**attempt)
        return step / 2 + random.uniform(0.0, step / 2)

    @staticmethod
    def _completion(resp: httpx.Response) -> Completion:
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            usage = data.get("usage") or {}
            return Completion(
                text=str(text),
                finish_reason=choice.get("finish_reason"),
                tokens_in=int(usage.get("prompt_tokens") or 0),
                tokens_out=int(usage.get("completion_tokens") or 0),
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # A 200 that is not a chat completion: not retried, the same server would answer the same.
            return _error(f"malformed response ({type(exc).__name__}: {exc}): {resp.text[:_ERR_MAX]!r}")

    def close(self) -> None:
        self._closed.set()
        with self._calls_lock:
            for call in self._calls:
                call.fail("openai engine was closed during the call")
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()
