"""The status word of a body that names none: a mutant of
``dispatcher/provider/contract.py`` that the contract tests let live
(``python -m bench.mutation --module dispatcher/provider/contract.py``)."""

from __future__ import annotations

from dispatcher.provider.contract import status_word


def test_an_absent_status_reads_as_the_empty_word() -> None:
    assert status_word({}) == ""
    assert status_word({"status": "Completed"}) == "completed"
