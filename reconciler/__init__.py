"""Settles tool calls whose outcome is unknown by asking the provider."""

__all__: list[str] = []
