"""Mutants of ``outbox_relay/relay.py`` the broker tests leave alive
(``python -m bench.mutation --module outbox_relay/relay.py``)."""

from __future__ import annotations

from outbox_relay.relay import TransientPublishError


def test_a_transient_publish_error_says_why_and_how_many_rows_were_marked() -> None:
    # The relay logs the error and backs off: its text is all an operator sees of why.
    error = TransientPublishError("broker did not acknowledge 3 rows", published=7)
    assert str(error) == "broker did not acknowledge 3 rows"
    assert error.published == 7
    assert TransientPublishError("away").published == 0
