"""The MySQL store's prepared (positional) statements are their named statements
exactly, with every parameter in its place (``_mysql_queries.Positional``)."""

from __future__ import annotations

import re

import pytest

from agent_ledger.stores import _mysql_queries as q

_NAMES = re.compile(r"%\((\w+)\)s")


def _literal(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return str(value)


def _as_sent(named: str, positional: q.Positional) -> tuple[str, str]:
    """Both statements with a distinct marker for each named parameter (a list of
    three markers for IN lists), as the driver would fill them in."""
    params: dict[str, object] = {name: f"<{name}>" for name in _NAMES.findall(named)}
    # begin's list of finished statuses is a constant of its positional form.
    filled_named = named % {
        name: _literal(q.FINISHED if name == "finished" else value)
        for name, value in params.items()
    }
    filled_positional = positional.sql % tuple(_literal(v) for v in positional.args(params))
    return filled_named, filled_positional


@pytest.mark.parametrize(
    ("named", "positional"),
    [
        (q.FIND, q.FIND_PS),
        (q.GET, q.GET_PS),
        (q.KEY_OF, q.KEY_OF_PS),
        (q.COMMIT, q.COMMIT_PS),
        (q.RECORD_TRY, q.RECORD_TRY_PS),
        (q.RELEASE, q.RELEASE_PS),
        (q.MARK_STARTED, q.MARK_STARTED_PS),
        (q.BEGIN_MARIADB, q.begin_ps(True, None)),
        (q.LOCK_BOUND_MARIADB.format(seconds=0) + q.BEGIN_MARIADB, q.begin_ps(True, 0)),
        (q.LOCK_BOUND_MARIADB.format(seconds=3) + q.BEGIN_MARIADB, q.begin_ps(True, 3)),
        (q.BEGIN_MYSQL, q.begin_ps(False, None)),
        (q.BEGIN_MYSQL, q.begin_ps(False, 3)),
    ],
)
def test_a_positional_statement_sends_what_its_named_one_sends(
    named: str, positional: q.Positional
) -> None:
    filled_named, filled_positional = _as_sent(named, positional)
    assert filled_positional == filled_named
    assert "%(" not in positional.sql


def test_repeated_parameters_take_their_value_at_each_place() -> None:
    statement = q.Positional("SELECT %(a)s, %(b)s, %(a)s, '%%Y'")
    assert statement.sql == "SELECT %s, %s, %s, '%%Y'"
    assert statement.args({"a": 1, "b": None, "c": "unused"}) == (1, None, 1)


def test_a_single_parameter_is_still_a_tuple() -> None:
    statement = q.Positional("SELECT %(a)s")
    assert statement.args({"a": ("x", "y")}) == (("x", "y"),)


def test_constants_are_sent_in_their_place() -> None:
    """A list of fixed values takes one placeholder per value, wherever it stands."""
    last = q.Positional("SELECT 1 WHERE k = %(k)s AND s IN %(s)s", s=("a", "b"))
    assert last.sql == "SELECT 1 WHERE k = %s AND s IN (%s, %s)"
    assert last.args({"k": "x", "s": "ignored"}) == ("x", "a", "b")
    between = q.Positional("SELECT %(a)s IN %(s)s, %(b)s", s=("c",))
    assert between.sql == "SELECT %s IN (%s), %s"
    assert between.args({"a": 1, "b": 2}) == (1, "c", 2)


def test_a_statement_without_parameters_or_with_unknown_constants_is_refused() -> None:
    with pytest.raises(ValueError, match="a statement with parameters"):
        q.Positional("SELECT %(a)s", b=("x",))
    with pytest.raises(ValueError, match="a statement with parameters"):
        q.Positional("SELECT 1")
    with pytest.raises(ValueError, match="a statement with parameters"):
        q.Positional("SELECT %(a)s IN %(s)s", s=())
