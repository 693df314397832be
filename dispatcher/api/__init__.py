"""The HTTP API (FastAPI)."""

from dispatcher.api.app import create_app

__all__ = ["create_app"]
