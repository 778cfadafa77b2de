"""SQLite-worded SQL as psycopg needs it: placeholders translated, quoted text kept."""

from __future__ import annotations

import pytest

from storage.base import to_postgres
from storage.models import StorageError


def test_placeholders_become_psycopg_ones_and_percent_signs_are_doubled() -> None:
    assert to_postgres("SELECT a FROM t WHERE b = ? AND c LIKE 'x%' AND d = ?") == (
        "SELECT a FROM t WHERE b = %s AND c LIKE 'x%%' AND d = %s"
    )


def test_question_marks_inside_quoted_text_stay() -> None:
    sql = "SELECT '?', \"odd?name\", 'it''s ?' FROM t WHERE x = ?"
    assert to_postgres(sql) == "SELECT '?', \"odd?name\", 'it''s ?' FROM t WHERE x = %s"


def test_dollar_quoted_bodies_stay_but_their_percent_signs_are_escaped() -> None:
    body = "CREATE FUNCTION f() RETURNS int AS $$ SELECT 1 WHERE '?' = '%' $$ LANGUAGE sql"
    assert to_postgres(body) == body.replace("%", "%%")


def test_numbered_placeholders_are_refused_not_misread() -> None:
    with pytest.raises(StorageError, match="numbered placeholders"):
        to_postgres("SELECT ?1, ?1")
