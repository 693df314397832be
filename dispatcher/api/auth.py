"""Producer authentication: ``Authorization: Bearer <api key>``, looked up in the
keyring (:mod:`dispatcher.control.principals`)."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import Request

from dispatcher.control.principals import Keyring, Principal
from dispatcher.errors import Unauthenticated
from dispatcher.settings import ApiKey

__all__ = ["ApiKeyAuth", "Principal"]


class ApiKeyAuth:
    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self.keyring = Keyring(keys)

    def authenticate(self, request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("send 'Authorization: Bearer <api key>'")
        found = self.keyring.by_key(token.strip())
        if found is None:
            raise Unauthenticated("the API key is not valid")
        return found[1]
