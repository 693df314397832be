"""The console's session: a signed cookie naming the operator's key by its hash.

The cookie never holds the key itself, only its SHA-256 (what the keyring is indexed
by) and a random session id, signed with a timestamp so it expires. The signature only
keeps forgeries away from the database: a session is live while its row in
``console_sessions`` is (:mod:`dispatcher.console.session_rows`), so signing out ends
it on every API replica, even for a copy of the cookie. Removing a key from the
configuration ends its sessions at once, and rotating the secret ends all of them. The
CSRF token is an HMAC of the session id, so a form can only be posted by a page this
session was served.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from itsdangerous import BadSignature, URLSafeTimedSerializer


@dataclass(frozen=True, slots=True)
class Session:
    key_hash: str
    session_id: str

    @property
    def record_id(self) -> str:
        """The session's row id: the SHA-256 of its id, so the table alone (a backup,
        a read-only role) holds nothing that names a session in a cookie."""
        return hashlib.sha256(self.session_id.encode()).hexdigest()


class SessionCodec:
    """Issues and reads session cookies, and the CSRF tokens bound to them."""

    def __init__(self, secret: bytes, *, max_age_seconds: int, secure: bool) -> None:
        self._secret = secret
        self._serializer = URLSafeTimedSerializer(secret, salt="tool-dispatcher.console")
        self.max_age_seconds = max_age_seconds
        self.secure = secure
        # The __Host- prefix makes the browser refuse the cookie unless it is Secure,
        # host-only and for the whole site: no subdomain can plant or read one.
        self.cookie_name = "__Host-td-console" if secure else "td-console"

    def issue(self, key_hash: str) -> tuple[Session, str]:
        """A new session of the key, and the cookie value that carries it."""
        session = Session(key_hash, secrets.token_urlsafe(16))
        return session, self._serializer.dumps({"k": key_hash, "s": session.session_id})

    def read(self, value: str | None) -> Session | None:
        """The session in ``value``, or None when it is absent, forged or expired."""
        if not value:
            return None
        try:
            data: Any = self._serializer.loads(value, max_age=self.max_age_seconds)
        except BadSignature:  # SignatureExpired is one
            return None
        if not isinstance(data, dict):
            return None
        key_hash, session_id = data.get("k"), data.get("s")
        if not isinstance(key_hash, str) or not isinstance(session_id, str):
            return None
        return Session(key_hash, session_id)

    def csrf_token(self, session: Session) -> str:
        message = f"csrf:{session.session_id}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(self.csrf_token(session), token)

    def cookie(self, value: str) -> dict[str, Any]:
        """Arguments of ``Response.set_cookie`` for a session cookie holding ``value``."""
        return {
            "key": self.cookie_name,
            "value": value,
            "max_age": self.max_age_seconds,
            "path": "/",
            "secure": self.secure,
            "httponly": True,
            "samesite": "strict",
        }
