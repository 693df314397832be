"""Service settings: loaded once at the entry point, then passed down.

Only this module reads the environment (prefix ``TOOL_DISPATCHER_``; ruff's banned-API
rule TID251 keeps it so); every other module receives a :class:`Settings` instance.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from dispatcher.webhook_settings import WebhookSettings

# admin: commands over every tenant (a capability paused for all); never a default.
Scope = Literal["submit", "read", "approve", "operate", "admin"]
# The event loop of every long-running process (dispatcher.runtime).
EventLoop = Literal["uvloop", "asyncio"]
# How each process writes its log lines (dispatcher.logs): plain text, or one JSON
# object per record.
LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
TracesExporter = Literal["none", "console", "otlp"]
ALL_SCOPES: tuple[Scope, ...] = ("submit", "read", "approve", "operate")


class ApiKey(BaseModel):
    """A producer credential: only the SHA-256 of the key is ever configured or stored."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    tenant: str = Field(min_length=1, max_length=128)
    scopes: list[Scope] = Field(default_factory=lambda: list(ALL_SCOPES))
    name: str = ""


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _seconds(value: object) -> object:
    # A section's value arrives as text, and pydantic reads a timedelta from text only
    # in ISO 8601 ("PT1H"): a plain number of seconds is taken as one.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def _upper(value: object) -> object:
    # "info" as well as "INFO", as logging itself takes.
    return value.upper() if isinstance(value, str) else value


def _secret_files(directory: Path | None) -> dict[str, str]:
    """The credentials in ``directory``: one per file, named by its capability id."""
    if directory is None:
        return {}
    return {p.name: p.read_text().strip() for p in sorted(directory.iterdir()) if p.is_file()}


def _revealed(secrets: dict[str, SecretStr]) -> dict[str, str]:
    return {name: secret.get_secret_value() for name, secret in secrets.items()}


@dataclass(frozen=True, slots=True)
class Topics:
    """The Kafka topics tool-dispatcher writes (:meth:`Settings.topics`): dispatch
    commands, execution events and escalation messages."""

    dispatch: str = "tool-dispatcher.commands"
    events: str = "tool-dispatcher.events"
    escalations: str = "tool-dispatcher.escalations"


DEFAULT_TOPICS = Topics()


class RelaySettings(BaseModel):
    """How `tool-dispatcher relay` (and the relay `up` runs) publishes the outbox:
    ``TOOL_DISPATCHER_RELAY__<FIELD>``, each the :class:`outbox_relay.RelayConfig` field
    of the same name, which validates it; unset means the relay's own default.

    The database, the broker and idempotence are the top-level settings; the table and
    the topics are the dispatcher's own (its migrations, ``*_topic``), so the relay has
    no say in them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    relay_id: str | None = None
    batch_size: int | None = None
    poll_interval: float | None = None
    read_interval: float | None = None
    lease_ttl: float | None = None
    # Seconds, or an ISO 8601 duration (``PT24H``).
    retention: Annotated[timedelta | None, BeforeValidator(_seconds)] = None
    retention_interval: float | None = None
    retention_batch: int | None = None
    metrics_interval: float | None = None
    backoff_initial: float | None = None
    backoff_max: float | None = None
    request_timeout_ms: int | None = None
    max_message_bytes: int | None = None
    linger_ms: int | None = None


_TOPIC_NAME = r"^[A-Za-z0-9._-]{1,249}$"


@dataclass(frozen=True, slots=True)
class BusRoute:
    """A request topic of bus intake, bound to one tenant, with the topics of its
    replies and of its dead letters (named after it: ``.requests.`` -> ``.replies.``
    and ``.dead-letters.``, or the name with that suffix)."""

    topic: str
    tenant: str

    def _sibling(self, kind: str) -> str:
        if ".requests." in self.topic:
            return self.topic.replace(".requests.", f".{kind}.", 1)
        return f"{self.topic}.{kind}"

    @property
    def replies(self) -> str:
        return self._sibling("replies")

    @property
    def dead_letters(self) -> str:
        return self._sibling("dead-letters")


class BusSettings(BaseModel):
    """``TOOL_DISPATCHER_BUS__<FIELD>``: bus intake (``tool-dispatcher bus-intake``).
    ``topics`` maps each request topic to the one tenant its records are recorded for
    (the tenant never comes from a record)."""

    model_config = ConfigDict(extra="forbid")

    topics: dict[
        Annotated[str, Field(pattern=_TOPIC_NAME)],
        Annotated[str, Field(min_length=1, max_length=128)],
    ] = Field(default_factory=dict)
    group_id: str = "tool-dispatcher-bus-intake"
    batch_max: int = Field(default=500, ge=1, le=10_000)
    # A record's value over this many bytes is refused (payload_too_large) and dead-lettered.
    max_record_bytes: int = Field(default=256 * 1024, ge=1024)

    def routes(self) -> dict[str, BusRoute]:
        return {topic: BusRoute(topic, tenant) for topic, tenant in self.topics.items()}


class Settings(BaseSettings):
    """Everything configurable; ``TOOL_DISPATCHER_<FIELD>`` in the environment, and
    ``TOOL_DISPATCHER_<SECTION>__<FIELD>`` for a section's field."""

    model_config = SettingsConfigDict(
        env_prefix="TOOL_DISPATCHER_", env_nested_delimiter="__", extra="ignore"
    )

    # None means "start an embedded one" (the `up` / `demo` commands do that).
    database_url: str | None = None
    kafka_bootstrap: str | None = None
    # Tansu and some managed brokers reject the idempotent producer.
    kafka_enable_idempotence: bool = True

    # uvloop unless set to "asyncio" (dispatcher.runtime.run).
    event_loop: EventLoop = "uvloop"

    # Logs on stderr (dispatcher.logs). None is INFO, and WARNING for the commands whose
    # output is their story (demo, api-key).
    log_format: LogFormat = "text"
    log_level: Annotated[LogLevel | None, BeforeValidator(_upper)] = None

    state_dir: Path = Path(".tool-dispatcher")
    capabilities_file: Path | None = None

    http_host: str = "127.0.0.1"
    http_port: int = 8780
    max_body_bytes: int = 256 * 1024
    api_keys: list[ApiKey] = Field(default_factory=list)
    # Limits of the shared front door (dispatcher.api.limits), on by default: a new
    # deployment is shared by tenants from its first day, and these numbers are far
    # above what one tenant's agents need (and above what one API process on two
    # cores commits), so they only stop a runaway producer. 0 turns a limit off.
    # Submissions per tenant: a token bucket refilled at this rate, this deep.
    submit_rate_per_second: float = Field(default=500.0, ge=0)
    submit_burst: int = Field(default=1000, ge=1)
    # Long-polls (GET ?waitSeconds=) one tenant may hold open at once; beyond it 429.
    long_polls_per_tenant: int = Field(default=200, ge=0)
    # A request body must have fully arrived this long after its headers (else 408
    # and the connection is closed); an idle keep-alive connection is closed after
    # http_keep_alive_seconds.
    http_body_timeout_seconds: float = Field(default=10.0, gt=0)
    http_keep_alive_seconds: int = Field(default=5, ge=1)
    # A request's head (request line and headers) must have fully arrived this long
    # after its first byte (else 408 and the connection is closed): a client trickling
    # header lines would otherwise hold its connection for ever.
    http_head_timeout_seconds: float = Field(default=10.0, gt=0)

    # The operator console (dispatcher.console). Its session cookies are signed with
    # this secret; unset, each API process draws its own at start, so sessions end when
    # it restarts and are not shared between replicas: set it when running several.
    console_secret: SecretStr | None = None
    console_session_seconds: int = Field(default=8 * 3600, ge=60)
    # The session cookie is sent over HTTPS only; `up` (plain http on 127.0.0.1)
    # turns it off.
    console_secure_cookie: bool = True

    db_pool_size: int = 20
    # A round trip per checkout that survives database restarts; a caller that handles
    # a dropped connection itself (or a benchmark matching a bare pool) may turn it off.
    db_pool_pre_ping: bool = True
    # Concurrent HTTP submissions are grouped into one commit; each caller is
    # answered only after the transaction holding its rows committed.
    intake_batch_max: int = 128

    # Workers.
    worker_group_id: str = "tool-dispatcher-workers"
    # Dispatch commands a worker fetches, claims and records together: each batch costs
    # two statements and two commits however many calls it holds, so a busy worker
    # takes big ones (a quiet one gets what the fetch found). Its sends go at most
    # worker_concurrency at a time; its leases cover every round of them.
    worker_batch_size: int = Field(default=500, ge=1)
    # Provider requests in flight per worker process.
    worker_concurrency: int = Field(default=64, ge=1)
    # Each request on its own kept-alive connection of the process's one pool: as many
    # as the requests in flight (aiohttp's cost per request does not grow with it).
    provider_max_connections: int = Field(default=64, ge=1)
    # Tansu holds every fetch for the full wait: keep it short for latency.
    kafka_fetch_max_wait_ms: int = Field(default=10, ge=0)
    topic_partitions: int = Field(default=8, ge=1)
    min_lease_seconds: float = Field(default=10.0, gt=0)
    # Added to the worst case of a call's retry policy to size its lease.
    lease_margin_seconds: float = Field(default=5.0, ge=0)
    # How soon the group notices a dead worker and hands its partitions over.
    kafka_session_timeout_ms: int = Field(default=10_000, ge=1000)
    # How soon the relay's producer and the workers' consumers see a topic's partitions
    # change (an operator adding some) without an error to tell them: aiokafka's 5 min.
    kafka_metadata_max_age_ms: int = Field(default=300_000, ge=100)
    recovery_interval_seconds: float = Field(default=2.0, gt=0)
    # A call authorized this long without a dispatch command in flight lost it (a broker
    # that forgot its messages): its command is written again (dispatcher.worker.redrive).
    redrive_after_seconds: float = Field(default=60.0, gt=0)
    redrive_interval_seconds: float = Field(default=15.0, gt=0)
    # Bulk operations (dispatcher.operations): calls per batch (one transaction each),
    # how long a processor's claim of an operation lasts unless renewed by a batch, and
    # how often a worker looks for a running operation nobody holds.
    operation_batch_size: int = Field(default=200, ge=1, le=5000)
    operation_lease_seconds: float = Field(default=30.0, gt=0)
    operation_interval_seconds: float = Field(default=1.0, gt=0)
    # e.g. "after-send:3": SIGKILL at the 3rd pass of that point (crash tests only; the
    # worker's points, or the retention job's: dispatcher.retention.crashpoints).
    crash_at: str | None = None
    # Provider credentials by capability id, added at send time only: the account every
    # tenant shares (a capability's providerAccount = "shared", the default).
    provider_secrets: dict[str, SecretStr] = Field(default_factory=dict)
    # Credentials of capabilities whose provider account is each tenant's own
    # (providerAccount = "per_tenant"): by tenant, then capability id.
    tenant_provider_secrets: dict[str, dict[str, SecretStr]] = Field(default_factory=dict)
    # A directory of files named after capability ids, each holding one credential (the
    # shared ones), and of directories named after tenants holding such files (theirs).
    provider_secrets_dir: Path | None = None

    # Reconciler: calls claimed per transaction, lookups in flight, how long a claim
    # keeps other reconcilers off a call, and the pause between passes of the loop.
    reconcile_batch_size: int = Field(default=200, ge=1)
    reconcile_concurrency: int = Field(default=64, ge=1)
    reconcile_lease_seconds: float = Field(default=60.0, gt=0)
    reconcile_interval_seconds: float = Field(default=5.0, gt=0)

    # Ops endpoints (/healthz, /readyz, /metrics: dispatcher.ops) of the worker, relay,
    # reconciler loop and approval sweeper: None is the process kind's own default port
    # (dispatcher.ops.DEFAULT_PORTS), 0 turns them off. The API serves its own on
    # http_port; the sandbox takes --ops-port instead (it reads no settings).
    ops_port: int | None = Field(default=None, ge=0, le=65535)
    ops_host: str = "127.0.0.1"

    approval_sweep_interval_seconds: float = Field(default=30.0, gt=0)

    # Retention (dispatcher.retention, `tool-dispatcher retention --once`): a terminal
    # call whose last change is older than its tenant's retention is archived with its
    # events, approval and escalations, verified, then removed. Days per tenant override
    # the default. The archive is a URL fsspec opens: file://<dir> (the default, under
    # state_dir) or s3://bucket/prefix (the `s3` extra), with archive_storage_options
    # passed to the filesystem (e.g. {"endpoint_url": ...} for an S3-compatible store).
    # Fractions of a day are allowed: a test or a chaos run keeps calls for seconds.
    retention_days: float = Field(default=30.0, gt=0)
    retention_days_by_tenant: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    archive_url: str | None = Field(default=None, pattern=r"^(file|s3)://.+")
    archive_storage_options: dict[str, Any] = Field(default_factory=dict)
    # Calls archived per batch (one set of files, one delete transaction), and how long
    # one pass may run before it stops between batches (a cron job's slot).
    retention_batch_size: int = Field(default=500, ge=1, le=10_000)
    retention_budget_seconds: float = Field(default=3000.0, gt=0)
    # Daily partitions of execution_events created ahead of today, so an event never
    # lands in the default partition while the job runs at least this often.
    retention_partitions_ahead_days: int = Field(default=7, ge=1, le=60)
    # A pass pushes its metrics here when set (the job is a CronJob: nothing scrapes
    # it), e.g. http://prometheus-pushgateway:9091.
    retention_pushgateway_url: str | None = None

    # OpenTelemetry traces (dispatcher.tracing), off by default: "console" prints spans
    # (development), "otlp" sends them over OTLP/HTTP to otlp_endpoint (the collector's
    # traces URL, e.g. http://127.0.0.1:4318/v1/traces). Each process names itself
    # tool-dispatcher-<process> (service.name). traces_db adds a span per SQL
    # statement (SQLAlchemy's instrumentation): many per call, so separately opted in.
    traces_exporter: TracesExporter = "none"
    otlp_endpoint: str | None = None
    traces_db: bool = False

    relay: RelaySettings = Field(default_factory=RelaySettings)
    bus: BusSettings = Field(default_factory=BusSettings)
    # Webhook subscriptions and their sender (docs/webhooks.md).
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)

    dispatch_topic: str = DEFAULT_TOPICS.dispatch
    events_topic: str = DEFAULT_TOPICS.events
    escalations_topic: str = DEFAULT_TOPICS.escalations

    def topics(self) -> Topics:
        """The topics as one value, for the writers and readers they are passed to."""
        return Topics(self.dispatch_topic, self.events_topic, self.escalations_topic)

    def provider_credentials(self) -> dict[str, str]:
        """Shared credentials by capability id: files in ``provider_secrets_dir`` first,
        then ``provider_secrets`` (which wins)."""
        found = _secret_files(self.provider_secrets_dir)
        found.update(_revealed(self.provider_secrets))
        return found

    def tenant_provider_credentials(self) -> dict[str, dict[str, str]]:
        """Each tenant's own credentials by capability id: the files of its directory
        in ``provider_secrets_dir`` first, then ``tenant_provider_secrets`` (which wins)."""
        found: dict[str, dict[str, str]] = {}
        if self.provider_secrets_dir is not None:
            for path in sorted(self.provider_secrets_dir.iterdir()):
                if path.is_dir() and not path.name.startswith("."):
                    found[path.name] = _secret_files(path)
        for tenant, secrets in self.tenant_provider_secrets.items():
            found.setdefault(tenant, {}).update(_revealed(secrets))
        return found

    def archive_location(self) -> str:
        """The archive's URL: ``archive_url``, else ``file://`` under ``state_dir``."""
        return self.archive_url or f"file://{self.state_dir.resolve() / 'archive'}"

    def sqlalchemy_url(self) -> str:
        if self.database_url is None:
            raise ValueError("no database configured (TOOL_DISPATCHER_DATABASE_URL)")
        return to_sqlalchemy_url(self.database_url)


def to_sqlalchemy_url(url: str) -> str:
    """Accept libpq-style URLs and name the psycopg 3 driver explicitly."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError(f"not a PostgreSQL URL: {url.split('://')[0]}://...")


def load_settings(overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build settings from the environment, with explicit overrides winning (tests use these)."""
    return Settings(**dict(overrides or {}))


def environment_without_settings() -> dict[str, str]:
    """This process's environment minus every ``TOOL_DISPATCHER_*`` variable: the base
    of a child process's environment whose settings the caller gives it explicitly."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TOOL_DISPATCHER_")}
