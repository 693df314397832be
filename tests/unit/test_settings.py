"""Settings: the environment is read in one place, explicit overrides win, database
URLs are normalised to the psycopg 3 driver, and API keys are configured by hash."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from dispatcher.relay_process import relay_config
from dispatcher.settings import (
    ALL_SCOPES,
    ApiKey,
    RelaySettings,
    hash_api_key,
    load_settings,
    to_sqlalchemy_url,
)
from dispatcher.worker.consumer import build_consumer
from outbox_relay import RelayConfig
from outbox_relay.kafka import build_producer

GOOD_HASH = hashlib.sha256(b"k").hexdigest()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TOOL_DISPATCHER_* variable of the surrounding shell leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("TOOL_DISPATCHER_"):
            monkeypatch.delenv(name)


def test_environment_is_read_with_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_DISPATCHER_HTTP_PORT", "9100")
    monkeypatch.setenv("TOOL_DISPATCHER_DATABASE_URL", "postgresql://db/app")
    monkeypatch.setenv(
        "TOOL_DISPATCHER_API_KEYS",
        json.dumps([{"sha256": GOOD_HASH, "tenant": "acme", "scopes": ["read"]}]),
    )

    settings = load_settings()

    assert settings.http_port == 9100
    assert settings.database_url == "postgresql://db/app"
    assert settings.api_keys == [ApiKey(sha256=GOOD_HASH, tenant="acme", scopes=["read"])]


def test_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_DISPATCHER_HTTP_PORT", "9100")
    monkeypatch.setenv("TOOL_DISPATCHER_MAX_BODY_BYTES", "5")

    settings = load_settings({"http_port": 9200})

    assert settings.http_port == 9200
    assert settings.max_body_bytes == 5  # not overridden: the environment still applies


def test_defaults_without_environment() -> None:
    settings = load_settings()
    assert settings.database_url is None
    assert settings.http_host == "127.0.0.1"
    assert settings.max_body_bytes == 256 * 1024
    assert settings.api_keys == []


def test_a_bad_value_is_a_validation_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_DISPATCHER_HTTP_PORT", "notanumber")
    with pytest.raises(ValidationError) as info:
        load_settings()
    assert info.value.errors()[0]["loc"] == ("http_port",)


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u:p@db:5432/app",
        "postgresql://u:p@db:5432/app",
        "postgresql+psycopg://u:p@db:5432/app",
    ],
)
def test_postgres_urls_get_the_psycopg_driver(url: str) -> None:
    assert to_sqlalchemy_url(url) == "postgresql+psycopg://u:p@db:5432/app"


@pytest.mark.parametrize(
    "url",
    [
        "mysql://u:secret-pw@db/app",
        "postgresql+asyncpg://u:secret-pw@db/app",
        "sqlite:///app.db",
        "db:5432/app",
    ],
)
def test_other_urls_are_refused_without_echoing_credentials(url: str) -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL URL") as info:
        to_sqlalchemy_url(url)
    assert "secret-pw" not in str(info.value)


def test_sqlalchemy_url_needs_a_database() -> None:
    with pytest.raises(ValueError, match="no database configured"):
        load_settings().sqlalchemy_url()
    assert (
        load_settings({"database_url": "postgres://db/app"}).sqlalchemy_url()
        == "postgresql+psycopg://db/app"
    )


def test_api_key_accepts_a_sha256_hex_digest() -> None:
    key = ApiKey(sha256=hash_api_key("tdk_x"), tenant="acme")
    assert key.sha256 == hashlib.sha256(b"tdk_x").hexdigest()
    assert tuple(key.scopes) == ALL_SCOPES


@pytest.mark.parametrize(
    "sha256",
    [
        pytest.param(GOOD_HASH.upper(), id="uppercase"),
        pytest.param(GOOD_HASH[:-1], id="63-chars"),
        pytest.param(GOOD_HASH + "0", id="65-chars"),
        pytest.param("g" * 64, id="not-hex"),
        pytest.param("tdk_plain_key", id="the-key-itself"),
        pytest.param("", id="empty"),
    ],
)
def test_api_key_refuses_anything_but_a_sha256_hex_digest(sha256: str) -> None:
    with pytest.raises(ValidationError):
        ApiKey(sha256=sha256, tenant="acme")


def test_api_key_refuses_unknown_scopes_and_empty_tenants() -> None:
    with pytest.raises(ValidationError):
        ApiKey(sha256=GOOD_HASH, tenant="acme", scopes=["root"])
    with pytest.raises(ValidationError):
        ApiKey(sha256=GOOD_HASH, tenant="")


# RelayConfig fields the dispatcher decides itself, and why; every other one is a
# ``relay`` setting.
NOT_RELAY_SETTINGS = {
    "database_url": "the top-level database_url",
    "kafka_bootstrap": "the top-level kafka_bootstrap",
    "enable_idempotence": "the top-level kafka_enable_idempotence",
    "metadata_max_age_ms": "the top-level kafka_metadata_max_age_ms (the workers' too)",
    "table": "the dispatcher's own outbox table, made by its migrations",
    "topic_prefix": "rows carry the topics the *_topic settings named and created",
    "topic_map": "rows carry the topics the *_topic settings named and created",
}
# A value unlike the relay's default for every relay setting, as the environment spells it.
RELAY_ENVIRONMENT = {
    "relay_id": ("relay-7", "relay-7"),
    "batch_size": ("17", 17),
    "poll_interval": ("0.25", 0.25),
    "read_interval": ("0.02", 0.02),
    "lease_ttl": ("4.5", 4.5),
    "retention": ("3600", timedelta(hours=1)),
    "retention_interval": ("7", 7.0),
    "retention_batch": ("99", 99),
    "metrics_interval": ("2", 2.0),
    "backoff_initial": ("0.5", 0.5),
    "backoff_max": ("9", 9.0),
    "request_timeout_ms": ("1234", 1234),
    "max_message_bytes": ("4096", 4096),
    "linger_ms": ("3", 3),
}


def test_every_relay_knob_is_a_setting_or_decided_by_the_dispatcher() -> None:
    knobs = {f.name for f in dataclasses.fields(RelayConfig)}
    assert knobs - set(NOT_RELAY_SETTINGS) == set(RelaySettings.model_fields)
    assert set(NOT_RELAY_SETTINGS) <= knobs


def test_relay_settings_from_the_environment_reach_the_relay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(RELAY_ENVIRONMENT) == set(RelaySettings.model_fields)
    defaults = RelayConfig(database_url="postgresql://db/app", kafka_bootstrap="k:9092")
    for name, (raw, _) in RELAY_ENVIRONMENT.items():
        monkeypatch.setenv(f"TOOL_DISPATCHER_RELAY__{name.upper()}", raw)
    monkeypatch.setenv("TOOL_DISPATCHER_KAFKA_ENABLE_IDEMPOTENCE", "false")
    monkeypatch.setenv("TOOL_DISPATCHER_KAFKA_METADATA_MAX_AGE_MS", "2500")

    config = relay_config(
        load_settings({"database_url": "postgresql://db/app", "kafka_bootstrap": "k:9092"})
    )

    for name, (_, value) in RELAY_ENVIRONMENT.items():
        assert getattr(config, name) == value != getattr(defaults, name), name
    assert (config.database_url, config.kafka_bootstrap) == ("postgresql://db/app", "k:9092")
    assert config.enable_idempotence is False
    assert config.metadata_max_age_ms == 2500 != defaults.metadata_max_age_ms
    assert (config.table, config.topic_prefix, dict(config.topic_map)) == ("outbox", "", {})


def test_unset_relay_settings_keep_the_relay_defaults() -> None:
    settings = load_settings({"database_url": "postgresql://db/app", "kafka_bootstrap": "k:9092"})
    config = relay_config(settings)
    defaults = RelayConfig(database_url="postgresql://db/app", kafka_bootstrap="k:9092")
    for name in RelaySettings.model_fields:
        if name != "relay_id":  # unique per process
            assert getattr(config, name) == getattr(defaults, name), name


def test_a_misspelt_relay_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_DISPATCHER_RELAY__BATCHSIZE", "17")
    with pytest.raises(ValidationError) as info:
        load_settings()
    assert info.value.errors()[0]["loc"] == ("relay", "batchsize")


def test_the_log_settings() -> None:
    assert load_settings().log_format == "text"
    assert load_settings().log_level is None
    settings = load_settings({"log_format": "json", "log_level": "debug"})
    assert (settings.log_format, settings.log_level) == ("json", "DEBUG")
    with pytest.raises(ValueError, match="log_format"):
        load_settings({"log_format": "xml"})


async def test_the_kafka_clients_take_their_metadata_age_from_the_settings() -> None:
    """A client sees a topic's partitions change only at its next metadata refresh (no
    error tells it): the relay's producer and the worker's consumer both refresh at the
    configured age."""
    settings = load_settings(
        {
            "database_url": "postgresql://db/app",
            "kafka_bootstrap": "127.0.0.1:9",
            "kafka_metadata_max_age_ms": 1500,
        }
    )
    producer = build_producer(relay_config(settings))
    consumer = build_consumer(settings, longest_batch_seconds=60)
    try:
        assert producer.client._metadata_max_age_ms == 1500
        assert consumer._client._metadata_max_age_ms == 1500
        assert consumer._max_poll_interval_ms == 90_000
    finally:
        await producer.stop()
        await consumer.stop()


def test_provider_credentials_are_shared_or_each_tenants_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Files: one per capability at the top (shared), one directory per tenant (its own).
    (tmp_path / "refund").write_text("shared-file\n")
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "refund").write_text("acme-file\n")
    (tmp_path / "acme" / "send").write_text("acme-send\n")
    (tmp_path / "..data").mkdir()  # what a Kubernetes secret volume holds besides its keys
    monkeypatch.setenv("TOOL_DISPATCHER_PROVIDER_SECRETS_DIR", str(tmp_path))
    monkeypatch.setenv(
        "TOOL_DISPATCHER_TENANT_PROVIDER_SECRETS",
        json.dumps({"acme": {"refund": "acme-env"}, "globex": {"refund": "globex-env"}}),
    )

    settings = load_settings()

    assert settings.provider_credentials() == {"refund": "shared-file"}
    assert settings.tenant_provider_credentials() == {
        "acme": {"refund": "acme-env", "send": "acme-send"},
        "globex": {"refund": "globex-env"},
    }
    assert "acme-env" not in repr(settings)
