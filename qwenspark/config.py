"""The typed configuration tree: YAML file + `--set key=value` overrides + secrets from env or file."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from datetime import UTC, date, datetime, time
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from qwenspark.errors import ConfigError


def _takes_number(annotation: Any) -> bool:
    """True for int, float and unions holding one (bool is not int here: it is its own annotation)."""
    if annotation in (int, float):
        return True
    return get_origin(annotation) in (Union, UnionType) and any(_takes_number(a) for a in get_args(annotation))


class _Section(BaseModel):
    # extra="forbid": a misspelt key fails at start instead of being silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic takes true as 1 for an int field: `engine.batch_size=true` would run with batches of 1.
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _takes_number(field.annotation):
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value


# Role names go into GRANT statements unquoted by the driver: plain identifiers only.
ROLE_PATTERN = r"^[A-Za-z0-9_]{1,64}$"


class DbConfig(_Section):
    """Where the MySQL-protocol server is and how to log in."""

    host: str = Field("127.0.0.1", description="Server host name or address.")
    port: int = Field(3306, ge=1, le=65535, description="Server TCP port.")
    database: str = Field("qwenspark", description="Database holding source and result tables.")
    user: str = Field("qwenspark", description="User for JDBC and transactional connections.")
    password_env: str = Field(
        "QWENSPARK_DB_PASSWORD", description="Environment variable that holds the password (checked first)."
    )
    password_file: Path | None = Field(
        None,
        description="File whose first line is the password, used when the env variable is unset; an empty first "
        "line is refused.",
    )
    admin_user: str | None = Field(
        None,
        description="Schema owner that `qwenspark init-db` and `load-reviews` log in as (None: db.user); jobs never "
        "use it.",
    )
    admin_password_env: str = Field(
        "QWENSPARK_DB_ADMIN_PASSWORD", description="admin_user's password: environment variable (checked first)."
    )
    admin_password_file: Path | None = Field(
        None, description="admin_user's password: file whose first line is it, when the env variable is unset."
    )
    job_role: str | None = Field(
        None,
        pattern=ROLE_PATTERN,
        description="Role that `qwenspark init-db` grants exactly the job's privileges (DML on the result tables, "
        "SELECT on source.table, CREATE TEMPORARY TABLES); grant it to db.user as its default role (None: no grants).",
    )
    dashboard_role: str | None = Field(
        None,
        pattern=ROLE_PATTERN,
        description="Role that `qwenspark init-db` grants SELECT on the dashboard views (v_*) only (None: no grants).",
    )
    dashboard_user: str = Field(
        "qwenspark_dashboard",
        description="Account `qwenspark dashboard` logs in as: read-only, holding db.dashboard_role (SELECT on the "
        "v_* views only).",
    )
    dashboard_password_env: str = Field(
        "QWENSPARK_DASHBOARD_PASSWORD", description="dashboard_user's password: environment variable (checked first)."
    )
    dashboard_password_file: Path | None = Field(
        None, description="dashboard_user's password: file whose first line is it, when the env variable is unset."
    )
    jdbc_jar: Path = Field(
        Path("/usr/share/java/mariadb-java-client.jar"), description="JDBC driver jar (MariaDB Connector/J)."
    )
    jdbc_driver: str = Field("org.mariadb.jdbc.Driver", description="JDBC driver class.")
    jdbc_params: str = Field(
        "useServerPrepStmts=true&useBulkStmts=true&characterEncoding=UTF-8",
        description="Extra JDBC URL parameters (bulk statements: ~3x faster writes, measured).",
    )

    def jdbc_url(self) -> str:
        """The JDBC URL. jdbc:mysql:// on purpose: jdbc:mariadb:// makes Spark pick its generic dialect."""
        return f"jdbc:mysql://{self.host}:{self.port}/{self.database}?{self.jdbc_params}"

    @field_validator("password_file")
    @classmethod
    def _password_file_not_empty(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        # An empty file fails here, at load time; a missing one only when the password is needed (the file may
        # be shipped to where the job runs). Not when the env variable is set: the file is not read then.
        if os.environ.get(info.data.get("password_env", "")) is not None:
            return value
        try:
            empty = value is not None and value.is_file() and _first_line(value) is None
        except (OSError, UnicodeDecodeError):
            return value  # unreadable here: password() says so when the password is needed
        if empty:
            raise ValueError(f"{value} is empty: its first line must be the password")
        return value

    # "admin_" on the copy owner() makes: messages then name the keys the user sets (db.admin_password_file).
    _keys: str = PrivateAttr("")

    def owner(self) -> DbConfig:
        """This connection as the schema owner (admin_user and its password), for init-db; self without one."""
        if self.admin_user is None:
            return self
        copy = self.model_copy(update={
            "user": self.admin_user,
            "password_env": self.admin_password_env,
            "password_file": self.admin_password_file,
        })
        copy._keys = "admin_"
        return copy

    def dashboard(self) -> DbConfig:
        """This connection as the dashboard's read-only account (dashboard_user and its password)."""
        copy = self.model_copy(update={
            "user": self.dashboard_user,
            "password_env": self.dashboard_password_env,
            "password_file": self.dashboard_password_file,
        })
        copy._keys = "dashboard_"
        return copy

    @property
    def user_key(self) -> str:
        """The config key of user, for messages: db.user, or db.admin_user on owner()'s copy."""
        return f"db.{self._keys}user"

    def password_source(self) -> str:
        """Where password() takes the password from, for messages (never the password itself)."""
        if os.environ.get(self.password_env) is not None or self.password_file is None:
            return f"${self.password_env}"
        return f"db.{self._keys}password_file ({self.password_file})"

    def password(self) -> SecretStr:
        """The password from the environment or the password file; never from the config values."""
        value = os.environ.get(self.password_env)
        if value is None and self.password_file is not None:
            where = f"db.{self._keys}password_file: {self.password_file}"
            try:
                value = _first_line(self.password_file)
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{where} cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
            if value is None:
                raise ConfigError(f"{where} is empty: its first line must be the password")
        if value is None:
            raise ConfigError(f"db: no password: set ${self.password_env} or db.{self._keys}password_file")
        return SecretStr(value)


def _first_line(path: Path) -> str | None:
    """The first line of a password file, None when it is blank (raises OSError when unreadable)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return lines[0] if lines and lines[0].strip() else None


class SourceConfig(_Section):
    """Which reviews to read and how to split the JDBC read."""

    table: str = Field("hotel_reviews", description="Source table.")
    num_partitions: int = Field(2, ge=1, description="JDBC read partitions (ranges of review_id).")
    fetchsize: int = Field(10_000, ge=1, description="JDBC fetch size.")
    min_id: int | None = Field(None, description="Only reviews with review_id >= min_id.")
    max_id: int | None = Field(None, description="Only reviews with review_id <= max_id.")
    window_column: Literal["created_at", "updated_at"] = Field(
        "created_at",
        description="The column created_from/created_until bound. created_at: reviews written in the window; "
        "updated_at (what the nightly DAG uses): reviews inserted OR changed in it, so edits and late inserts with "
        "an old created_at are caught. updated_at must be maintained by the table's DDL (hotel_reviews has it from "
        "schema v004: DATETIME(3) DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3), in UTC).",
    )
    created_from: datetime | None = Field(
        None,
        description="Only reviews with window_column >= this (the name is from when only created_at was windowed). "
        "Held as an aware UTC datetime: a value without an offset (2026-11-01 16:00:00, or a date: its midnight) is "
        "UTC, whatever the driver's time zone; one with an offset (2026-11-01T16:00:00+08:00) is converted to UTC. "
        "The column is compared as UTC.",
    )
    created_until: datetime | None = Field(
        None,
        description="Only reviews with window_column < this; read as created_from (no offset: UTC; an offset: "
        "converted to UTC).",
    )

    @field_validator("created_from", "created_until", mode="before")
    @classmethod
    def _date_is_midnight(cls, value: Any) -> Any:
        # YAML reads 2026-11-01 as a date; a window bound means its midnight.
        return datetime.combine(value, time()) if isinstance(value, date) and not isinstance(value, datetime) else value

    @field_validator("created_from", "created_until")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        # Never the process's local zone: a naive bound read in local time would shift the window by the
        # driver's offset (an Airflow worker in UTC+8 skipped 8 hours a night).
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    @model_validator(mode="after")
    def _window_not_empty(self) -> SourceConfig:
        if self.created_from and self.created_until and self.created_from >= self.created_until:
            raise ValueError(
                f"created_from {self.created_from.isoformat()} is not before created_until "
                f"{self.created_until.isoformat()}: the window selects nothing"
            )
        return self


class CleanConfig(_Section):
    """How raw review text is made safe for the model."""

    max_chars: int = Field(20_000, ge=100, description="Hard character cap applied before tokenising.")
    max_review_tokens: int = Field(
        768, ge=16, description="Reviews longer than this many tokens are cut and flagged truncated."
    )


class EngineConfig(_Section):
    """The inference engine built on each executor (the cache key: same config, same engine)."""

    kind: Literal["vllm", "transformers", "openai", "custom"] = Field(
        "vllm",
        description="Engine implementation (openai: any OpenAI-compatible server, e.g. `vllm serve`; custom: "
        "engine.factory builds it).",
    )
    factory: str | None = Field(
        None,
        description="custom: 'module:callable' taking the EngineConfig and returning an Engine; the module must be "
        "importable in the executors' Python workers.",
    )
    model: str = Field(..., description="Model folder or hub id of a Qwen instruct model.")
    model_revision: str | None = Field(
        None,
        description="The weights' revision as you assert it (e.g. a hub commit sha): results are keyed by it. None: "
        "a local model folder is keyed by a sha256 of its files (config, tokenizer, weights; cached per file under "
        "$QWENSPARK_CACHE/fingerprints or ~/.cache/qwenspark/fingerprints, so moving the folder keeps the key and "
        "swapping its weights changes it); a hub id or served model by its name.",
    )
    default_model: bool | str = Field(
        False,
        description="Fetch and convert a pinned model into `model` if it is missing: true the embedded default "
        "(qwen2.5-coder-0.5b), or a pinned model's name (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b); false: run "
        "`model` as it is.",
    )
    tokenizer: str | None = Field(None, description="Tokenizer folder, when it differs from model.")
    dtype: str = Field(
        "auto",
        description="Weights and activations dtype (bfloat16, float16, float32); auto: bfloat16 on GPUs and on CPUs "
        "with native bf16 (AVX-512 BF16, AMX, Arm BF16), float32 on other CPUs, where bf16 is emulated (3x slower).",
    )
    max_model_len: int = Field(2048, ge=128, description="Context length (prompt + output tokens).")
    max_tokens: int = Field(160, ge=8, description="Most tokens generated per review.")
    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature (0 = greedy, reproducible).")
    seed: int = Field(0, description="Sampling seed.")
    batch_size: int = Field(32, ge=1, description="Reviews handed to the engine per call, whatever the partition.")
    enforce_eager: bool = Field(True, description="vLLM: skip graph capture/compile (fast start on CPU).")
    gpu_memory_utilization: float | None = Field(
        None, gt=0.0, le=1.0, description="vLLM: share of GPU memory for the engine (None: vLLM default)."
    )
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="vLLM: GPUs per engine (None: as many as the Spark task holds, 1 without GPUs)."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description=(
            "cuda: the job refuses to start without GPU settings; auto: use the GPUs Spark assigns if any; "
            "cpu: ignore them (the engine's worker sees no GPU)."
        ),
    )
    guided: bool = Field(True, description="Constrain output to the JSON schema (xgrammar).")
    answer_order: Literal["verdict_first", "verdict_last"] = Field(
        "verdict_first",
        description="Field order of the guided JSON answer. The job sets it from prompt.version's template (the "
        "template's few-shot answers use that order); leave it unset.",
    )
    summary_max_chars: PositiveInt | dict[str, PositiveInt] | None = Field(
        None, description="The guided grammar's bound on the summary's length in characters: one for every language, "
        "or by language (its \"en\" entry for any other). The job sets it from prompt.version's template (None: the "
        "schema's bound); leave it unset.",
    )
    summary_script: bool = Field(
        False, description="The guided grammar writes each summary in its review's language's script (zh, en). The "
        "job sets it from prompt.version's template; leave it unset.",
    )
    aspect_map: bool = Field(
        False, description="The guided answer's aspects as one object, aspect -> sentiment (fewer tokens). The job "
        "sets it from prompt.version's template; leave it unset.",
    )
    answer_format: Literal["json", "lines"] = Field(
        "json", description="What the engine writes: one JSON object, or the same fields as three lines in fewer "
        "tokens (parse.AnswerFormat); stored alike. The job sets it from prompt.version's template; leave it unset.",
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="Penalty on each output token by how often the answer has used it already "
        "(OpenAI semantics): it breaks the summary loops of a small model. The job sets it from prompt.version's "
        "template; leave it unset.",
    )
    optimistic: bool = Field(
        False, description="Write each answer without the grammar first (no per-token mask work, the cost that bounds "
        "a GPU); an answer that is not valid JSON of the schema, or breaks the grammar's summary rules, is generated "
        "again with the grammar, so every stored answer fits it. The job sets it from prompt.version's template; leave "
        "it unset.",
    )
    optimistic_min_fit: float = Field(
        0.6, ge=0.0, le=1.0, description="With an optimistic prompt version, batch and stream: while fewer than this "
        "share of an engine's last engine.optimistic_window first answers fit the grammar, its next batches are "
        "guided from their first token (one batch in 20 still goes without it, so the share stays measured): a "
        "model whose answers mostly misfit would write most of them twice. 0: always optimistic. The service has "
        "its own (serve.optimistic_min_fit).",
    )
    optimistic_window: int = Field(200, ge=4, description="First answers the fitting share is read over (per engine).")
    cut_dead_ends: bool = Field(
        True, description="vLLM (the service, the batch and the stream), with an optimistic version whose answers are "
        "in lines (v13): an answer written without the grammar ends at its first token past which no answer can fit "
        "it (a first line that is no label, a summary past its bound or in the other script, a fourth line; "
        "parse.lines_viable; qwenspark/engines/dead_ends.py), and the grammar's attempt starts then instead of after "
        "the rest. Off: each such answer is written to its end (to compare).",
    )
    batch_grammar_masks: int | None = Field(
        None, ge=0, le=64, description="vLLM: fill each step's grammar masks with xgrammar's batch matcher on so many "
        "native threads (qwenspark/engines/vllm_masks.py, a vLLM plugin), where vLLM fills them one after another "
        "below 129 guided answers a step: 24 % of the engine core's step loop at 200 guided requests/s on an H200 "
        "(bench/results/serve_history.md, stop 38). 0: vLLM's own fill. Unset: the service on a GPU uses half its "
        "cores, at most 8 (stop 39, an H100: 189-193 answers/s against 174, label P99 0.61-0.65 s against 1.52 s); "
        "elsewhere vLLM's own.",
    )
    yield_to_service: float = Field(
        0.0, ge=0.0, le=0.95, description="vLLM, the batch and stream beside `qwenspark serve` on the same GPU (or "
        "CPU): the share of time this engine stands still while a service on the same host and devices has answers "
        "in flight (qwenspark/engines/yielding.py: the services publish their count in /dev/shm; vLLM's "
        "pause_generation keeps the batch's requests). 0.8: 160 ms of every 200 ms, the batch running the rest; a "
        "batch step that outlasts its run lengthens the next hold by four times its overrun (at most 5 s), so the "
        "share holds with long steps too. 0: never (the default); at most 0.95, so that the batch always moves. "
        "Beside a 7B service at 100 requests/s on one H100, 0.95 with engine_kwargs.max_num_batched_tokens 4096 kept "
        "its whole answer P99 at 0.92-1.05 s (4.0 s not giving way) for 42 % of the batch's throughput (stop 43).",
    )
    repair_penalty: float | None = Field(
        None, ge=0.0, le=2.0, description="An answer cut by max_tokens or with a looping summary is generated once "
        "more with this frequency penalty (None or 0: stored as it came). The job sets it from prompt.version's "
        "template; leave it unset.",
    )
    borrowed_retry: bool = Field(
        True, description="An answer whose summary repeats a stretch of a few-shot example's summary that its review "
        "lacks (a claim the guest never made; `qwenspark eval`'s 'summary borrowed') is generated once more from a "
        "prompt without that example, with the grammar's settings; the row stores that answer's summary and aspects "
        "and keeps the first answer's label (false: stored as it came).",
    )
    label_logprobs: bool = Field(
        False,
        description="Ask the engine for the log-probabilities of the sentiment label's first token (set from the "
        "prompt version: a calibrated version needs them; the vllm engine reports them, others give none).",
    )
    continuous: bool = Field(
        True, description="Feed the engine continuously across batches (vLLM); false: one generate per batch."
    )
    max_in_flight: int | None = Field(
        None, ge=1, description="Requests outstanding per task in continuous mode before the next batch is added "
        "(None: 2 x batch_size); a batch joins whole, so up to this plus batch_size while it is added.",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment set in the executor before the engine is imported."
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for vllm.LLM / from_pretrained."
    )
    base_url: str | None = Field(
        None,
        validate_default=True,
        description="openai: the server's API root, up to and including /v1 (e.g. http://127.0.0.1:8000/v1).",
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY",
        description="openai: environment variable holding the API key (read when the engine starts; "
        "unset: no Authorization header, as `vllm serve` without --api-key expects).",
    )
    max_concurrency: int = Field(
        16, ge=1, description="openai: most requests in flight per engine (per Python worker)."
    )
    request_timeout_s: float = Field(
        60.0, gt=0.0, description="openai: timeout of one HTTP request (connect, send, wait for the answer), seconds."
    )
    max_retries: int = Field(
        5,
        ge=0,
        description="openai: retries of one request after a 408, 429, 5xx, timeout or connection error; still "
        "failing after them, the task fails (EngineError) and Spark retries it: an outage fails the run, it "
        "never becomes error rows."
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_are_strings(cls, value: Any) -> Any:
        # `--set engine.env.X=1` parses 1 as an int; the environment only holds strings.
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("factory")
    @classmethod
    def _factory_for_custom(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("kind") == "custom" and (not value or ":" not in value):
            raise ValueError("required when engine.kind=custom, as 'module:callable'")
        return value

    @field_validator("default_model", mode="before")
    @classmethod
    def _pinned_model_name(cls, value: Any) -> Any:
        # true, false or a catalogue name; checked here so that a misspelt name fails at load, not on the workers.
        from qwenspark.models.default import CATALOGUE, pinned

        if isinstance(value, str):
            value = value.strip().lower()
            if value in ("true", "false"):
                return value == "true"
        if not isinstance(value, bool | str):
            raise ValueError(f"expected true, false or one of {', '.join(CATALOGUE)}, got {value!r}")
        pinned(value)  # raises ValueError naming the known models
        return value

    @model_validator(mode="after")
    def _default_model_folder(self) -> EngineConfig:
        # default_model fetches into <parent of model>/<the model's folder name> and runs that: another folder name
        # would run the pinned model under the user's model name (job_runs.model, review_sentiment.model).
        from qwenspark.models.default import pinned

        selected = pinned(self.default_model)
        if selected is not None and Path(self.model).name != selected.dirname:
            wanted = Path(self.model).parent / selected.dirname
            shown, what = ("true", "the default model") if self.default_model is True else (
                str(self.default_model), selected.title)
            raise ValueError(
                f"default_model: {shown} fetches {what} into a folder named {selected.dirname}, "
                f"not {self.model!r}: set engine.model to {wanted}, or engine.default_model: false to run "
                f"{self.model!r}"
            )
        return self

    @field_validator("base_url")
    @classmethod
    def _base_url_for_openai(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("kind") == "openai":
            if not value:
                raise ValueError("required when engine.kind=openai (e.g. http://127.0.0.1:8000/v1)")
            if not value.startswith(("http://", "https://")):
                raise ValueError(f"must start with http:// or https://, got {value!r}")
        # One spelling, so that a trailing slash neither doubles in URLs nor changes the engine cache key.
        return value.rstrip("/") if value else value

    def cache_key(self) -> str:
        """Stable key of the engine cache: two tasks with equal configs share one engine."""
        # How batches are fed does not change the engine: those fields stay out of the key.
        shape = self.model_dump_json(exclude={"batch_size", "continuous", "max_in_flight"})
        return hashlib.sha256(shape.encode()).hexdigest()[:16]


class PromptConfig(_Section):
    """Which versioned prompt template to use."""

    version: str = Field("v1", description="Prompt template version (see qwenspark.prompts.TEMPLATES).")
    guard: bool = Field(
        True,
        description="Cut what addresses the model inside a review (orders, fake answers, chat turns, fake "
        "</review> tags: qwenspark.guard) before the engine reads it; the stored review is unchanged. A review "
        "that holds nothing else gets an empty: error.",
    )
    aspect_evidence: bool = Field(
        True,
        description="Store only the aspects the review has a word of (qwenspark.aspect_evidence: cue words per "
        "aspect, English and Chinese); the others are the model's guesses. The default 0.5B with v10 named 6.2 "
        "aspects a review where it talked about 4.4, no better than naming all eight (held-out aspect F1 0.71, "
        "precision 0.60); with this on, F1 0.82, precision 0.83 "
        "(bench/aspect_quality.py, README \"Aspect quality\"). On by default since stop 44. Not part of input_key: "
        "rows stored before it was turned on keep their aspects until analysed again (job.reprocess).",
    )

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        # Checked at load time: an unknown version would otherwise fail only inside the first Spark task.
        from qwenspark.prompts import get_template

        try:
            get_template(value)
        except ConfigError as exc:  # its message names prompt.version already; pydantic adds the field
            raise ValueError(str(exc).removeprefix("prompt.version: ")) from None
        return value


class SinkConfig(_Section):
    """How results are written (table names are fixed by sql/schema.sql)."""

    write_partitions: int = Field(
        2,
        ge=1,
        description="Parallel JDBC connections writing the staging table. Independent of the inference "
        "parallelism: the analysed rows are materialised (shuffle files) before this write.",
    )
    batchsize: int = Field(2_000, ge=1, description="JDBC batch size of the staging write.")
    isolation_level: Literal["READ_COMMITTED", "READ_UNCOMMITTED", "REPEATABLE_READ", "SERIALIZABLE", "NONE"] = Field(
        "READ_COMMITTED",
        description="JDBC isolation of the staging write; NONE commits every JDBC batch (no long transaction per "
        "partition; a retried task then finds its earlier rows staged, which the commit tolerates).",
    )
    commit_chunk_rows: int = Field(
        50_000,
        ge=1,
        description="The upsert into review_sentiment commits in chunks of at most this many rows, so a run of "
        "millions of rows never holds one giant transaction.",
    )


class JobConfig(_Section):
    """What the job does with reviews it has already analysed, how it spreads the work, when a run fails."""

    reprocess: bool = Field(False, description="Analyse every selected review again, even when its result is current.")
    retry_errors: bool = Field(
        False,
        description="Also analyse again reviews whose last result was a content error (empty:, invalid:, prompt:, "
        "parse:); any other error (engine:, an outage) is always analysed again.",
    )
    repartition: int | None = Field(
        None,
        ge=1,
        description="Partitions fed to mapInPandas, overriding slots x partitions_per_slot (None: derived).",
    )
    slots: int | None = Field(
        None,
        ge=1,
        description="Engines running at once (inference tasks in parallel). None: from the cluster: executors x "
        "GPUs per executor / GPUs per engine; on CPU one engine per executor (local mode: one engine).",
    )
    partitions_per_slot: int = Field(
        1,
        ge=1,
        description="Partitions per engine slot. Measured (bench/slot_scaling.py, 4 slots, answers of 16-256 "
        "tokens): 1 had the shortest tail and the best throughput, since equal-sized partitions of many batches "
        "average the lengths out and each task end drains the engine's continuous feed; 2-4 let a slow or "
        "retried slot's share be spread over the others (preemptible or uneven nodes).",
    )
    max_error_rate: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Largest share of the rows sent to the model whose result is an error (engine or parse errors) "
        "for which the run still commits. "
        "Above it the run fails with a non-zero exit and commits nothing; input errors (empty:, invalid:) do not "
        "count, in the share or in its denominator. 0: any model error fails the run; 1: never fails on errors.",
    )
    purge_deleted: bool = Field(
        False,
        description="Batch runs first remove the results of reviews no longer in source.table (hard deletes), with "
        "their share of hotel_sentiment_daily and aspect_sentiment, in chunks of sink.commit_chunk_rows (within "
        "source.min_id/max_id when set; job_runs.rows_purged counts them). Only where source.table holds every "
        "analysed review: not for results of the stream's files source. The nightly DAG turns it on.",
    )
    cores_per_slot: int | None = Field(
        None,
        ge=1,
        description="CPU cores (threads) each engine gets. None: the executor's cores / its slots; local mode: "
        "the local cores / slots.",
    )
    retention_days: int = Field(
        90,
        ge=0,
        description="job_runs rows (never 'running' ones) and stream_commits rows older than this many days are "
        "deleted, in small transactions, when a batch run or a stream starts (and hourly while a stream runs); the "
        "latest stream_commits row of each query is always kept (a replay is checked against it). 0: keep forever.",
    )


class SparkConfig(_Section):
    """Spark session settings the job applies (spark-submit --conf still wins where set)."""

    app_name: str = Field("qwenspark-hotel-sentiment", description="Spark application name.")
    master: str | None = Field(None, description="Master URL when not started by spark-submit.")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark settings.")


class DeltaConfig(_Section):
    """An optional Delta Lake copy of each run's results, appended once per run (idempotent on replay)."""

    enabled: bool = Field(False, description="After a run commits in MySQL, append its result rows to a Delta table.")
    path: str = Field(".run/delta/review_sentiment", description="Delta table location (folder or object-store URI).")
    writer: Literal["deltalake", "spark"] = Field(
        "deltalake",
        description="deltalake: delta-rs from the driver (extra `delta`); "
        "spark: df.write.format('delta') (needs delta-spark jars on the classpath).",
    )
    app_id: str = Field(
        "qwenspark-batch", description="Delta app transaction id; the run's version under it makes replays no-ops."
    )


class StreamConfig(_Section):
    """The Structured Streaming job: source, micro-batch bounds, trigger, checkpoint, engine keepalive."""

    query_name: str = Field(
        "hotel_sentiment_stream",
        pattern=r"^[A-Za-z0-9_]{1,24}$",
        description="Streaming query name (job_runs.job is stream:<name>).",
    )
    source: Literal["mysql", "files"] = Field(
        "mysql", description="mysql: new rows of source.table by review_id; files: a landing folder of review files."
    )
    checkpoint_location: str = Field(
        ".run/checkpoints/hotel_sentiment_stream",
        description="Spark checkpoint folder (a new folder is a new query: batch ids restart under a new query id).",
    )
    trigger_seconds: float = Field(10.0, gt=0.0, description="Processing-time trigger interval, seconds.")
    available_now: bool = Field(
        False,
        description="Process what is there now in bounded micro-batches, stop once a trigger finds nothing new "
        "(catch-up runs, tests).",
    )
    max_rows_per_batch: int = Field(512, ge=1, description="mysql source: most reviews per micro-batch.")
    read_partitions: int = Field(
        1,
        ge=1,
        description="mysql source: read tasks per micro-batch (review_id ranges). They run in Python workers: "
        "more of them at once than analysis tasks per executor start extra workers, which may load extra engines.",
    )
    start_after_id: int | Literal["latest"] | None = Field(
        None,
        description="mysql source, new checkpoint only: start after this review_id (None: from the first review; "
        "latest: only reviews inserted from now on).",
    )
    gap_wait_seconds: float = Field(
        5.0,
        ge=0.0,
        description="mysql source: hold the offset before a gap in review_ids this long, so rows of a transaction "
        "that commits late are not passed over (0: ids are committed in order).",
    )
    files_path: str = Field(".run/landing/reviews", description="files source: landing folder.")
    files_format: Literal["json", "csv", "parquet"] = Field(
        "json",
        description="files source: json (one object per line, fields by name), parquet, or csv (a header row, "
        "columns in the order review_id, hotel_id, created_at, lang, rating, text: another header fails the batch).",
    )
    max_files_per_trigger: int = Field(10, ge=1, description="files source: most new files per micro-batch.")
    keepalive_seconds: float = Field(
        20.0,
        ge=0.0,
        description="While idle, touch the executors' Python workers this often so Spark (which ends workers idle "
        "for 60 s) keeps the loaded engine (0: off).",
    )
    batch_retries: int = Field(
        2, ge=0, description="Retries of a failed micro-batch (e.g. a database restart) before the query fails."
    )


class DashboardConfig(_Section):
    """The web dashboard (`qwenspark dashboard`): where it listens and what its page shows."""

    host: str = Field("127.0.0.1", description="Address to bind (loopback by default: the page has no login).")
    port: int = Field(8050, ge=1, le=65535, description="TCP port.")
    poll_seconds: int = Field(30, ge=2, le=3600, description="How often the page asks for new data.")
    default_days: int = Field(
        90, ge=1, le=3660, description="Date range shown when the URL names none: the last N days that have results."
    )
    top_hotels: int = Field(
        20, ge=3, le=100, description="Hotels drawn in the ranking and the heatmap (the rest are one 'others' entry)."
    )
    latest_reviews: int = Field(20, ge=1, le=200, description="Negative and mixed reviews listed.")
    review_url: str | None = Field(
        None,
        description="Link of a listed review, with {review_id} in it (e.g. your review admin); None: the "
        "dashboard's own /api/review/{review_id}.",
    )
    pool_size: int = Field(4, ge=1, le=64, description="Database connections the dashboard keeps open.")

    @field_validator("review_url")
    @classmethod
    def _review_url_has_id(cls, value: str | None) -> str | None:
        if value is not None and "{review_id}" not in value:
            raise ValueError("must contain {review_id}")
        return value


class ServeConfig(_Section):
    """The online service (`qwenspark serve`): one review analysed on request with the job's prompt and parsing."""

    host: str = Field("127.0.0.1", description="Address to bind. Any address but loopback needs an API key.")
    port: int = Field(8060, ge=1, le=65535, description="TCP port.")
    api_key_env: str = Field("QWENSPARK_SERVE_API_KEY", description="Environment variable holding the API key "
                             "clients send as `Authorization: Bearer KEY` (checked first).")
    api_key_file: str | None = Field(None, description="File holding the API key (read at start).")
    max_queue: int = Field(256, ge=1, description="Reviews admitted at once (decoding or waiting for the engine); "
                           "a request beyond it gets 429 with Retry-After, so memory stays bounded.")
    max_reviews: int = Field(16, ge=1, le=1000, description="Reviews one request may carry.")
    max_body_bytes: int = Field(1_000_000, ge=1000, description="Largest request body (413 beyond it).")
    request_timeout_s: float = Field(30.0, gt=0, description="A request still unanswered after this gets 504.")
    store: bool = Field(False, description="Upsert each answer into review_sentiment with the batch's input_key (the "
                        "batch and stream then skip that review), committed as the batch commits (job_runs, "
                        "aggregates); needs review_id, hotel_id and created_at as in hotel_reviews.")
    store_flush_s: float = Field(1.0, gt=0, le=60, description="How often stored answers are committed.")
    workers: int = Field(0, ge=0, le=64, description="Service processes on the one port; the kernel spreads "
                         "connections over them. With engine.kind vllm they share one engine, loaded once by "
                         "`qwenspark serve` (qwenspark.serve.shared); other kinds are loaded in each. /healthz and "
                         "/metrics describe the worker that answers. 0: 3 with engine.kind vllm on a CUDA GPU and at "
                         "least 8 cores to run on (its CPU affinity; measured on an H200: "
                         "bench/results/serve_history.md, stop 33), else 1.")
    engines: int = Field(0, ge=0, le=8, description="With engine.kind vllm: vLLM engines the service's workers share, "
                         "loaded one after another on the same GPU(s), each taking an equal part of the service's "
                         "engine.gpu_memory_utilization (unset: of vLLM's default 0.9); each request goes to the one "
                         "with the fewest in progress. More than 1 where a small model's engine core is bound by its "
                         "own step loop's CPU while the GPU idles: 2 took the 0.6B's whole-answer P99 at 200 guided "
                         "requests/s on an H200 from 1.14-1.21 s to 0.42-0.59 s, 3 did no better "
                         "(bench/results/serve_history.md, stops 38 and 50). 0: 2 with engine.kind vllm on a CUDA "
                         "GPU, at least 8 cores to run on and a dense model of at most 1B parameters (from its "
                         "folder's config.json; qwenspark/serve/sizing.py), else 1.")
    optimistic: bool = Field(True, description="With an optimistic prompt version (v11, v13): write each answer "
                             "without the grammar first, as the batch does, and generate the few that misfit again "
                             "with it, pinned to the label already sent. Off: every answer guided from its first "
                             "token (no second attempt, but the grammar's per-token work bounds a GPU's answers/s).")
    optimistic_min_fit: float = Field(
        0.6, ge=0.0, le=1.0, description="With serve.optimistic: while fewer than this share of the last "
        "serve.optimistic_window first answers fit the grammar, new requests are guided from their first token (one "
        "in 20 still goes without it, so the share stays measured). Below about the ratio of an unguided answer's "
        "time to a guided one's, writing answers twice costs more than the grammar saves: a small model's answers "
        "mostly misfit (the 0.5B's v13 answers fit 21 %). 0: always optimistic.")
    optimistic_window: int = Field(200, ge=4, description="First answers the fitting share is read over (per worker).")

    def api_key(self) -> SecretStr | None:
        """The API key from api_key_env, else api_key_file; None when neither is set."""
        value = os.environ.get(self.api_key_env)
        if not value and self.api_key_file:
            try:
                value = Path(self.api_key_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"serve.api_key_file: cannot read {self.api_key_file}: {exc.strerror}") from None
        return SecretStr(value) if value else None


class QwenSparkConfig(_Section):
    """The whole configuration of a qwenspark job."""

    db: DbConfig = Field(default_factory=DbConfig, description="Database connection.")
    source: SourceConfig = Field(default_factory=SourceConfig, description="Input selection.")
    clean: CleanConfig = Field(default_factory=CleanConfig, description="Input cleaning.")
    engine: EngineConfig = Field(..., description="Inference engine.")
    prompt: PromptConfig = Field(default_factory=PromptConfig, description="Prompt template.")
    sink: SinkConfig = Field(default_factory=SinkConfig, description="Output tables.")
    job: JobConfig = Field(default_factory=JobConfig, description="Incremental behaviour.")
    spark: SparkConfig = Field(default_factory=SparkConfig, description="Spark settings.")
    delta: DeltaConfig = Field(default_factory=DeltaConfig, description="Optional Delta Lake copy of the results.")
    stream: StreamConfig = Field(default_factory=StreamConfig, description="Structured Streaming job.")
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig, description="Web dashboard.")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="Online service.")

    @model_validator(mode="after")
    def _engines_are_vllms(self) -> QwenSparkConfig:
        engines = self.serve.engines
        if engines > 1 and self.engine.kind != "vllm":
            raise ValueError(f"serve.engines {engines} needs engine.kind vllm (got {self.engine.kind})")
        return self

    def config_hash(self) -> str:
        """Hash of everything that shapes results (recorded in job_runs); holds no secret."""
        # The dashboard's account shapes no result either.
        secrets = {"password_file", "admin_password_file", "dashboard_user", "dashboard_password_env",
                   "dashboard_password_file"}
        payload = self.model_dump(
            mode="json", exclude={"spark": True, "stream": True, "dashboard": True, "serve": True, "db": secrets})
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set tree's value at a dotted key (`engine.batch_size`), making the sections on the way."""
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {key} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """`key.sub=value` -> (key.sub, value parsed as YAML so numbers and booleans get their types)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key=value")
    if "password" in key.lower() and not key.lower().endswith(("password_env", "password_file")):
        raise ConfigError(
            f"--set {key}: passwords never go on the command line; "
            "put it in the variable named by db.password_env or in db.password_file"
        )
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def _message(msg: str) -> str:
    # Our validators' ValueErrors come back as "Value error, <text>": the text alone says it.
    return msg.removeprefix("Value error, ")


# In a config file's values: the folder the file is in, so that its paths hold from any working folder (conf/local.yaml
# names the checkout's .cache and .run this way). Plain relative paths stay the working folder's: on YARN, --files puts
# a file in each container's working folder, and a config written for that names it so.
CONFIG_DIR = "${CONFIG_DIR}"


def anchor_paths(tree: Any, folder: str) -> Any:
    """tree with ${CONFIG_DIR} in its strings replaced by folder (a path that starts with it, normalised)."""
    if isinstance(tree, dict):
        return {key: anchor_paths(value, folder) for key, value in tree.items()}
    if isinstance(tree, list):
        return [anchor_paths(value, folder) for value in tree]
    if isinstance(tree, str) and CONFIG_DIR in tree:
        value = tree.replace(CONFIG_DIR, folder)
        return os.path.normpath(value) if tree.startswith(CONFIG_DIR) else value
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> QwenSparkConfig:
    """Read YAML, apply overrides, anchor ${CONFIG_DIR}, validate; errors name the offending key."""
    tree: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path}: top level must be a mapping")
        tree = loaded
    for item in overrides or []:
        set_path(tree, *parse_override(item))
    # Overrides may name it too (--set engine.model=${CONFIG_DIR}/../models/x); without a file: the working folder.
    tree = anchor_paths(tree, str(Path(path).absolute().parent) if path is not None else os.getcwd())
    return validate_config(tree, f" {path}" if path else "")


def validate_config(tree: Mapping[str, Any], where: str = "") -> QwenSparkConfig:
    """A config from its sections as a mapping; errors name the offending key (where: " <file>", or "")."""
    try:
        return QwenSparkConfig.model_validate(tree)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {_message(err['msg'])}" for err in exc.errors())
        raise ConfigError(f"invalid config{where}: {problems}") from None
