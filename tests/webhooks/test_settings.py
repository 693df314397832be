"""Subscriptions and their secrets are settings: inline or from a file, secrets from
files (or a map that wins), and what cannot work is refused when the settings load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from dispatcher.settings import load_settings
from tests.fixtures.cli import run_cli


def _sub(sub_id: str, url: str = "https://hooks.example/td") -> dict[str, object]:
    return {"id": sub_id, "tenant": "acme", "url": url, "events": ["escalation.opened"]}


def test_subscriptions_inline_and_from_a_file_with_secrets_from_files(tmp_path: Path) -> None:
    listed = tmp_path / "webhooks.json"
    listed.write_text(json.dumps([_sub("from-file")]))
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "inline").write_text("whsec_ZmlsZQ==\n")
    (secrets / "from-file").write_text("whsec_b3ZlcnJpZGRlbg==")
    conf = load_settings(
        {
            "webhooks": {
                "subscriptions": [_sub("inline")],
                "subscriptions_file": listed,
                "secrets_dir": secrets,
                "secrets": {"from-file": "whsec_bWFw"},
            }
        }
    ).webhooks
    assert [s.id for s in conf.all_subscriptions()] == ["inline", "from-file"]
    # A file's secret without its newline; the map wins over a file.
    assert conf.signing_secrets() == {"inline": "whsec_ZmlsZQ==", "from-file": "whsec_bWFw"}
    # The secret never shows in the settings' text.
    assert "bWFw" not in repr(conf) and "bWFw" not in str(load_settings().model_dump())


@pytest.mark.parametrize(
    "webhooks",
    [
        {"subscriptions": [_sub("a", url="ftp://hooks.example/td")]},
        {"subscriptions": [{**_sub("a"), "events": ["escalation.open"]}]},
        {"subscriptions": [{**_sub("a"), "events": []}]},
        {"subscriptions": [_sub("a b")]},
        {"lease_seconds": 10, "timeout_seconds": 10},
    ],
)
def test_what_cannot_work_is_refused_at_load(webhooks: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        load_settings({"webhooks": webhooks})


def test_two_subscriptions_with_one_id_are_refused() -> None:
    conf = load_settings({"webhooks": {"subscriptions": [_sub("a"), _sub("a")]}}).webhooks
    with pytest.raises(ValueError, match="repeat"):
        conf.all_subscriptions()


def test_the_command_exits_2_on_a_subscriptions_file_it_cannot_read(tmp_path: Path) -> None:
    done = run_cli(
        "webhooks",
        "--once",
        TOOL_DISPATCHER_DATABASE_URL="postgresql://127.0.0.1:1/none",
        TOOL_DISPATCHER_WEBHOOKS__SUBSCRIPTIONS_FILE=str(tmp_path / "missing.json"),
    )
    assert done.returncode == 2
    assert "bad webhook subscriptions" in done.stderr and len(done.stderr.splitlines()) == 1
