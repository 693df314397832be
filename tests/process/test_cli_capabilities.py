"""`tool-dispatcher capabilities` as a real subprocess on the real database: a pause
and a resume for one tenant or every tenant, what each tenant then sees, a repeated
pause that changes nothing, and one-line refusals of bad input."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest

from devtools.registries import NOWHERE, capability, registry_of, registry_toml
from tests.fixtures.cli import run_cli

pytestmark = pytest.mark.postgres


@pytest.fixture
def env(tmp_path: Path, database_url: str) -> dict[str, str]:
    caps = tmp_path / "capabilities.toml"
    caps.write_text(registry_toml(registry_of(capability("refund", NOWHERE))))
    return {
        "TOOL_DISPATCHER_DATABASE_URL": database_url,
        "TOOL_DISPATCHER_CAPABILITIES_FILE": str(caps),
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("capabilities", *args, **env)


def test_a_pause_holds_its_scope_and_a_resume_lifts_it(
    env: dict[str, str], database_url: str
) -> None:
    done = cli(
        env, "pause", "refund", "--tenant", "acme", "--reason", "provider down", "--by", "ana"
    )
    assert (done.returncode, done.stdout.strip()) == (0, "refund paused"), done.stderr
    again = cli(env, "pause", "refund", "--tenant", "acme", "--reason", "still down")
    assert again.stdout.strip() == "unchanged: already paused"
    acme = cli(env, "list", "--tenant", "acme").stdout
    assert acme.startswith("refund paused waiting=0 (this tenant since ")
    assert "by ana: 'provider down'" in acme
    assert cli(env, "list", "--tenant", "globex").stdout.strip() == "refund active waiting=0"

    assert cli(env, "pause", "refund", "--every-tenant", "--reason", "all down").returncode == 0
    assert cli(env, "list", "--tenant", "globex").stdout.startswith("refund paused")
    assert cli(env, "resume", "refund", "--tenant", "acme", "--reason", "back").stdout.strip() == (
        "refund resumed"
    )
    # Every tenant's pause still holds acme's calls.
    assert "every tenant since" in cli(env, "list", "--tenant", "acme").stdout
    with psycopg.connect(database_url) as conn:
        facts = conn.execute("SELECT event_type, tenant FROM capability_events ORDER BY seq")
        assert facts.fetchall() == [
            ("capability.paused", "acme"),
            ("capability.paused", ""),
            ("capability.resumed", "acme"),
        ]
        # The resume is timed after its commit (dispatcher.ledger.pauses.after_resume).
        timed = conn.execute(
            "SELECT resumed_at > changed_at FROM capability_states WHERE tenant = 'acme'"
        )
        assert timed.fetchall() == [(True,)]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("pause", "nope", "--tenant", "acme", "--reason", "x"), "no capability 'nope'"),
        (("pause", "refund", "--tenant", "acme", "--reason", " "), "--reason"),
        (("pause", "refund", "--reason", "x"), "--tenant"),
        (("resume", "refund", "--tenant", "a", "--every-tenant", "--reason", "x"), "not allowed"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    env: dict[str, str], args: tuple[str, ...], said: str
) -> None:
    done = cli(env, *args)
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert said in done.stderr
