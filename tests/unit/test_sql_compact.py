"""``compact``: a statement's wire text loses its layout, never a literal, an
identifier or a comment's meaning."""

from __future__ import annotations

from dispatcher.db.sqltext import compact


def test_layout_goes_and_literals_stay() -> None:
    sql = "SELECT  a ,\n    b\nFROM f( x )  WHERE c = 'two  words, ( kept )' OR d = ' '"
    assert compact(sql) == "SELECT a,b FROM f(x)WHERE c = 'two  words, ( kept )' OR d = ' '"


def test_escaped_quotes_and_quoted_identifiers_stay() -> None:
    sql = """SELECT "odd  name ( x )" ,  'it''s  ( here )'\n FROM  t"""
    assert compact(sql) == """SELECT "odd  name ( x )",'it''s  ( here )' FROM t"""


def test_placeholders_are_untouched() -> None:
    assert compact("f( %(calls)s::JSONB ) , %(topic)s") == "f(%(calls)s::JSONB),%(topic)s"


def test_text_whose_layout_may_matter_is_left_whole() -> None:
    for sql in (
        "SELECT 1 -- a comment\n, 2",
        "SELECT 1 /* a\n comment */ , 2",
        "DO $$ BEGIN  PERFORM 1 ; END $$",
    ):
        assert compact(sql) == sql
