"""Request bodies and answers: JSON parsed into a pydantic model, or a 400
``validation_failed`` naming every problem; JSON answers from models."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Response
from pydantic import BaseModel, ValidationError

from dispatcher.errors import ValidationFailed

M = TypeVar("M", bound=BaseModel)
JSON = "application/json"


def parse_body(model: type[M], raw: bytes, what: str) -> M:
    """``model`` from ``raw`` JSON; an empty body counts as ``{}``."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        errors = [
            {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        # ``field`` names the first fault: a field by its wire name, or inside
        # ``input`` the JSON path of the value that cannot be stored.
        first = exc.errors(include_url=False, include_input=False)[0]
        field = (first.get("ctx") or {}).get("path") or ".".join(str(p) for p in first["loc"])
        raise ValidationFailed(f"the {what} is not valid", field=field, errors=errors) from None


def json_response(body: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An answer whose JSON is already serialised (models dump faster than FastAPI's
    generic encoder)."""
    return Response(body, status_code=status, media_type=JSON, headers=headers)


def model_response(model: BaseModel, status: int = 200) -> Response:
    """A read model in its published (camelCase) form."""
    return json_response(model.model_dump_json(by_alias=True), status)
