"""The console's session cookie and CSRF token (pure logic): what signs, what expires,
what a forger cannot make, and the cookie's attributes."""

from __future__ import annotations

import time

import pytest
from itsdangerous import URLSafeTimedSerializer

from dispatcher.console.session import Session, SessionCodec

SECRET = b"s" * 32


def codec(max_age: int = 60, *, secure: bool = True) -> SessionCodec:
    return SessionCodec(SECRET, max_age_seconds=max_age, secure=secure)


def test_a_cookie_reads_back_as_its_key_hash_and_a_fresh_session_id() -> None:
    c = codec()
    (issued, first_value), (_, second_value) = c.issue("ab" * 32), c.issue("ab" * 32)
    first, second = c.read(first_value), c.read(second_value)
    assert first == issued
    assert first is not None and second is not None
    assert first.key_hash == "ab" * 32
    assert first.session_id != second.session_id
    assert len(first.session_id) >= 16


@pytest.mark.parametrize("value", [None, "", "garbage", "a.b.c"])
def test_nothing_or_garbage_is_no_session(value: str | None) -> None:
    assert codec().read(value) is None


def test_another_secret_or_a_tampered_cookie_is_no_session() -> None:
    _, value = codec().issue("ab" * 32)
    other = SessionCodec(b"t" * 32, max_age_seconds=60, secure=True)
    assert other.read(value) is None
    payload, _, signature = value.rpartition(".")
    # The first character: the last one's low bits are base64 padding, so changing it
    # may leave the decoded signature the same.
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    assert codec().read(f"{payload}.{flipped}") is None


def test_a_signed_value_of_the_wrong_shape_is_no_session() -> None:
    forged = URLSafeTimedSerializer(SECRET, salt="tool-dispatcher.console")
    assert codec().read(forged.dumps(["ab" * 32])) is None
    assert codec().read(forged.dumps({"k": 1, "s": "x"})) is None
    assert codec().read(forged.dumps({"k": "ab" * 32})) is None


def test_a_cookie_older_than_the_session_length_is_no_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = codec(max_age=60)
    _, value = c.issue("ab" * 32)
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + 59)
    assert c.read(value) is not None
    monkeypatch.setattr(time, "time", lambda: now + 62)
    assert c.read(value) is None


def test_the_csrf_token_is_bound_to_the_session_and_the_secret() -> None:
    c = codec()
    one, two = Session("ab" * 32, "one"), Session("ab" * 32, "two")
    token = c.csrf_token(one)
    assert c.csrf_ok(one, token)
    assert not c.csrf_ok(two, token)
    assert not c.csrf_ok(one, None)
    assert not c.csrf_ok(one, "")
    other = SessionCodec(b"t" * 32, max_age_seconds=60, secure=True)
    assert not other.csrf_ok(one, token)


def test_the_cookie_is_http_only_strict_and_host_locked_when_secure() -> None:
    cookie = codec(max_age=600).cookie("v")
    assert cookie == {
        "key": "__Host-td-console",
        "value": "v",
        "max_age": 600,
        "path": "/",
        "secure": True,
        "httponly": True,
        "samesite": "strict",
    }
    plain = codec(secure=False).cookie("v")
    assert plain["key"] == "td-console" and plain["secure"] is False
    assert plain["httponly"] is True and plain["samesite"] == "strict"


def test_the_row_id_names_the_session_without_holding_its_id() -> None:
    session, _ = codec().issue("ab" * 32)
    assert session.record_id == Session("cd" * 32, session.session_id).record_id
    assert session.record_id != Session("ab" * 32, session.session_id + "x").record_id
    assert session.session_id not in session.record_id
    assert len(session.record_id) == 64
