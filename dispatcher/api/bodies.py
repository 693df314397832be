"""Request bodies: JSON parsed into a pydantic model, or a 400 ``validation_failed``
naming every problem."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from dispatcher.errors import ValidationFailed

M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], raw: bytes, what: str) -> M:
    """``model`` from ``raw`` JSON; an empty body counts as ``{}``."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise ValidationFailed(
            f"the {what} is not valid",
            errors=[
                {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
                for e in exc.errors(include_url=False, include_input=False)
            ],
        ) from None
