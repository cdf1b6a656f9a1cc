"""OpenAI-compatible HTTP engine (`vllm serve`, hosted Qwen endpoints): bounded, retried chat completions."""

from __future__ import annotations

import email.utils
import logging
import os
import random
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import httpx

from qwenspark.config import EngineConfig
from qwenspark.engines.base import Completion, Message
from qwenspark.errors import ConfigError, EngineError
from qwenspark.parse import json_schema

log = logging.getLogger(__name__)

# Completion.finish_reason of a row whose request finally failed; parse.parse_completion turns it into the
# row's error ("engine: <reason>"). A Completion has no error field and base.py is shared by every engine.
ERROR_PREFIX = "error: "

# A server's Retry-After is honoured, but a broken one must not park a task for hours.
_RETRY_AFTER_MAX_S = 600.0
_ERR_MAX = 300


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


def _error(reason: str) -> Completion:
    return Completion(text="", finish_reason=ERROR_PREFIX + reason, tokens_in=0, tokens_out=0)


class OpenAIEngine:
    """Chat completions from an OpenAI-compatible server, one POST per conversation, up to
    `max_concurrency` in flight.

    Unlike the in-process engines, generate() never raises for one bad request: a row whose request
    finally failed (a 4xx other than 408/429 at once; a 429, 408, 5xx, timeout or connection error after
    `max_retries` retries) comes back as `Completion(text="", finish_reason="error: <reason>", 0, 0)`,
    which parse.parse_completion reports as the row's error. The other rows of the batch keep their results.

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
        # The key comes from the environment only (never config values or argv) and is never logged.
        api_key = os.environ.get(cfg.api_key_env)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
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
            "seed": cfg.seed,
            "max_tokens": cfg.max_tokens,
        }
        if cfg.guided:
            self._body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "review_analysis", "schema": json_schema(), "strict": True},
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

    def encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            return [ord(ch) for ch in text]
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        if self._tokenizer is None:
            return "".join(chr(i) for i in ids)
        return str(self._tokenizer.decode(list(ids)))

    def generate(self, conversations: Sequence[Sequence[Message]]) -> list[Completion]:
        if self._closed.is_set():
            raise EngineError("openai engine is closed")
        # map() keeps the input order; the pool's size is the bound on requests in flight.
        return list(self._pool.map(self._request, range(len(conversations)), conversations))

    def _request(self, index: int, conversation: Sequence[Message]) -> Completion:
        """One conversation through the retry loop; never raises for an HTTP or transport failure."""
        body = {**self._body, "messages": list(conversation)}
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                resp = self._client.post(self._url, json=body)
            except httpx.TimeoutException as exc:
                reason = f"timeout after {self._cfg.request_timeout_s:g} s ({type(exc).__name__})"
            except httpx.TransportError as exc:
                reason = f"connection: {type(exc).__name__}: {exc}"[:_ERR_MAX]
            else:
                if resp.status_code == 200:
                    return self._completion(resp)
                reason = f"HTTP {resp.status_code}: {_server_message(resp)}"
                # 408 is the server's own timeout, so retried like ours; every other 4xx (400: prompt too
                # long, 401: bad key, 404: unknown model) would fail again the same way.
                if resp.status_code not in (408, 429) and resp.status_code < 500:
                    return _error(reason)
                retry_after = _retry_after_s(resp.headers.get("Retry-After"))
            if attempt >= self._cfg.max_retries or self._closed.is_set():
                if self._cfg.max_retries:
                    reason = f"{reason} (gave up after {attempt + 1} attempts)"
                return _error(reason)
            delay = retry_after if retry_after is not None else self._backoff(attempt)
            attempt += 1
            log.warning(
                "request %d to %s failed (%s); retry %d/%d in %.2f s",
                index,
                self._url,
                reason,
                attempt,
                self._cfg.max_retries,
                delay,
            )
            # Woken early by close(), so that shutting down never waits out a backoff.
            self._closed.wait(delay)

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
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()
