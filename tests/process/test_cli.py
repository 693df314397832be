"""The ``tool-dispatcher`` command, run as a real subprocess: bad input ends with exit
code 2 and one line on stderr; ``migrate`` and ``api-key`` do their job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
import pytest

from dispatcher.settings import ApiKey, hash_api_key
from tests.fixtures.cli import run_cli


def assert_one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tool-dispatcher: error: ")
    return lines[0]


def test_unknown_subcommand() -> None:
    line = assert_one_line_error(run_cli("frobnicate"))
    assert "frobnicate" in line


def test_no_subcommand() -> None:
    assert_one_line_error(run_cli())


def test_migrate_without_a_database() -> None:
    line = assert_one_line_error(run_cli("migrate"))
    assert "TOOL_DISPATCHER_DATABASE_URL" in line


def test_bad_setting() -> None:
    line = assert_one_line_error(run_cli("migrate", TOOL_DISPATCHER_HTTP_PORT="notanumber"))
    assert "http_port" in line


def test_unreadable_capabilities_file(tmp_path: Path) -> None:
    # `serve` needs the registry (migrate no longer reads it); the URL is never dialled.
    line = assert_one_line_error(
        run_cli(
            "serve",
            TOOL_DISPATCHER_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
            TOOL_DISPATCHER_CAPABILITIES_FILE=str(tmp_path / "missing.toml"),
        )
    )
    assert "missing.toml" in line


def test_a_registry_whose_keys_would_meet_in_a_shared_account_refuses_to_load(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "capabilities.toml"
    registry.write_text(
        '[[capability]]\nid = "refund"\nsideEffects = true\nproviderKeys = "as_written"\n'
        'request = { url = "http://127.0.0.1:9/v1/requests" }\n'
    )
    line = assert_one_line_error(
        run_cli(
            "serve",
            TOOL_DISPATCHER_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
            TOOL_DISPATCHER_CAPABILITIES_FILE=str(registry),
        )
    )
    assert "capabilities.toml" in line
    assert 'providerKeys = "as_written" needs providerAccount = "per_tenant"' in line


@pytest.mark.parametrize("command", ["serve", "worker", "recover --once", "reconcile"])
def test_a_service_without_a_capabilities_file_refuses_to_start(command: str) -> None:
    # No silent fallback to the sandbox registry (it points at 127.0.0.1:8790).
    line = assert_one_line_error(
        run_cli(
            *command.split(),
            TOOL_DISPATCHER_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
            TOOL_DISPATCHER_KAFKA_BOOTSTRAP="127.0.0.1:1",
        )
    )
    assert "TOOL_DISPATCHER_CAPABILITIES_FILE" in line


@pytest.mark.postgres
def test_migrate_creates_the_schema(empty_database_url: str) -> None:
    result = run_cli("migrate", TOOL_DISPATCHER_DATABASE_URL=empty_database_url)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "migrated to head"
    with psycopg.connect(empty_database_url) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables")}
        [(version,)] = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    assert {"tool_calls", "execution_events", "outbox"} <= tables
    assert version


@pytest.mark.postgres
def test_migrate_an_up_to_date_database_is_a_no_op(database_url: str) -> None:
    result = run_cli("migrate", TOOL_DISPATCHER_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "migrated to head"


@pytest.mark.postgres
def test_runs_recount_counts_the_calls_again(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO tool_calls (tool_call_id, tenant, run_id, capability_id, input,"
            " idempotency_key, provider_key, request_fingerprint, status)"
            " VALUES ('tc-1', 'acme', 'run-1', 'send', '{}', 'k-1', 'k-1', 'fp', 'completed')"
        )
    assert "TOOL_DISPATCHER_DATABASE_URL" in assert_one_line_error(run_cli("runs", "recount"))
    result = run_cli("runs", "recount", TOOL_DISPATCHER_DATABASE_URL=database_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "recounted 1 runs"
    with psycopg.connect(database_url) as conn:
        found = conn.execute("SELECT tenant, run_id, completed, calls FROM run_summaries")
        assert found.fetchall() == [("acme", "run-1", 1, 1)]


def test_api_key_prints_a_key_and_the_settings_line_of_its_hash() -> None:
    result = run_cli("api-key")

    assert result.returncode == 0, result.stderr
    key, settings_line = result.stdout.splitlines()
    assert key.startswith("tdk_") and len(key) > 40
    name, _, value = settings_line.partition("=")
    assert name == "TOOL_DISPATCHER_API_KEYS"
    [configured] = json.loads(value.strip("'"))
    assert configured["sha256"] == hash_api_key(key)
    assert key not in settings_line  # only the hash is configured
    ApiKey.model_validate(configured)


def test_api_key_is_new_every_time() -> None:
    first, second = run_cli("api-key"), run_cli("api-key")
    assert first.stdout.splitlines()[0] != second.stdout.splitlines()[0]


def assert_check_fails(result: subprocess.CompletedProcess[str], says: str) -> None:
    assert result.returncode == 1, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tool-dispatcher: error: ") and says in lines[0]


@pytest.mark.postgres
def test_migrate_check_refuses_an_empty_database_and_changes_nothing(
    empty_database_url: str,
) -> None:
    result = run_cli("migrate", "--check", TOOL_DISPATCHER_DATABASE_URL=empty_database_url)

    assert_check_fails(result, "not at head")
    with psycopg.connect(empty_database_url) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert tables.fetchall() == []


@pytest.mark.postgres
def test_migrate_check_passes_once_migrated(empty_database_url: str) -> None:
    env = {"TOOL_DISPATCHER_DATABASE_URL": empty_database_url}
    assert run_cli("migrate", **env).returncode == 0

    result = run_cli("migrate", "--check", **env)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.postgres
def test_migrate_check_refuses_a_database_one_revision_behind(empty_database_url: str) -> None:
    env = {"TOOL_DISPATCHER_DATABASE_URL": empty_database_url}
    assert run_cli("migrate", **env).returncode == 0
    assert run_cli("migrate", "--downgrade", "--revision", "-1", **env).returncode == 0

    assert_check_fails(run_cli("migrate", "--check", **env), "not at head")


@pytest.mark.postgres
def test_migrate_check_passes_a_schema_a_newer_release_migrated(empty_database_url: str) -> None:
    # Expand, then contract: while a release's migration has run and its pods roll out,
    # the old release's pods restart through this gate on the newer schema.
    env = {"TOOL_DISPATCHER_DATABASE_URL": empty_database_url}
    assert run_cli("migrate", **env).returncode == 0
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_a_newer_release'")

    result = run_cli("migrate", "--check", **env)

    assert result.returncode == 0, result.stderr
    assert "9999_a_newer_release, newer than this release's head" in result.stderr


def test_migrate_check_on_an_unreachable_database_is_one_line() -> None:
    result = run_cli(
        "migrate", "--check", TOOL_DISPATCHER_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none"
    )

    assert_check_fails(result, "cannot reach the database")
