"""Every status list in both schema files, checked against the enum.

The schemas are released files, never edited in place, so when the enum or
the transition table changes these tests say which list no longer agrees
(and a new migration must fix it). Each list is found by its SQL, and the
number of lists is pinned, so a new one cannot go unchecked.
"""

from __future__ import annotations

import re

import pytest

from agent_ledger.status import COMPLETIONS, TERMINAL, EffectStatus
from agent_ledger.stores.postgres import SCHEMA_SQL
from agent_ledger.stores.saga_base import SAGA_OPEN, SagaStatus
from agent_ledger.stores.sqlite import SQLITE_MIGRATIONS, SQLITE_SCHEMA_SQL

S = EffectStatus
#: Version 3 keeps sagas, whose statuses are another table's (tested at the end).
SAGAS_BEGIN = "Version 3: sagas"
SCHEMAS = {
    "postgres": SCHEMA_SQL[: SCHEMA_SQL.index(SAGAS_BEGIN)],
    "sqlite": "\n".join(
        [SQLITE_SCHEMA_SQL, *(text for v, text in SQLITE_MIGRATIONS.items() if v != 3)]
    ),
}
SAGA_SCHEMAS = {
    "postgres": SCHEMA_SQL[SCHEMA_SQL.index(SAGAS_BEGIN) :],
    "sqlite": SQLITE_MIGRATIONS[3],
}
#: Where each schema's version 2 begins.
VERSION_2 = {"postgres": "Version 2:", "sqlite": "schema, version 2"}
# `status IN (...)`, `status NOT IN (...)`, `status <> '...'` (with OLD./NEW. too).
LIST = re.compile(r"\bstatus\s+(NOT\s+IN|IN|<>|=)\s*\(?((?:\s*'[^']*'\s*,?)+)\)?", re.IGNORECASE)


def status_lists(schema: str) -> list[tuple[str, str, frozenset[str]]]:
    """(the SQL text before the list, the operator, the values) for every status list."""
    code = "\n".join(line.split("--", 1)[0] for line in schema.splitlines())
    return [
        (code[max(0, m.start() - 300) : m.start()], m.group(1).upper(),
         frozenset(re.findall(r"'([^']*)'", m.group(2))))
        for m in LIST.finditer(code)
    ]  # fmt: skip


def values(statuses: frozenset[S] | set[S]) -> frozenset[str]:
    return frozenset(s.value for s in statuses)


@pytest.mark.parametrize("kind", SCHEMAS)
def test_every_listed_status_is_in_the_enum(kind: str) -> None:
    for _, _, listed in status_lists(SCHEMAS[kind]):
        assert listed <= values(set(S)), (kind, listed)


@pytest.mark.parametrize("kind", SCHEMAS)
def test_the_check_constraint_lists_every_status(kind: str) -> None:
    [check] = [v for before, _, v in status_lists(SCHEMAS[kind]) if "CHECK" in before[-40:]]
    assert check == values(set(S))


@pytest.mark.parametrize("kind", SCHEMAS)
def test_the_open_index_covers_exactly_the_unfinished_statuses(kind: str) -> None:
    """The partial index of pending work: every status that can still change."""
    [open_list] = [v for before, _, v in status_lists(SCHEMAS[kind]) if "open_idx" in before]
    assert open_list == values(set(S) - TERMINAL)


def test_the_notify_trigger_skips_only_a_handlers_own_outcome() -> None:
    """The trigger stays quiet only for processing -> succeeded/failed (dedup_count 0):
    the outcomes a handler's commit records. Every other change, a cancel included,
    may have a waiter and notifies."""
    lists = [(op, v) for before, op, v in status_lists(SCHEMA_SQL) if "TRIGGER" in before]
    assert lists == [("<>", values({S.PROCESSING})), ("NOT IN", values(COMPLETIONS - {S.CANCELED}))]
    assert all(s in COMPLETIONS for s in (S.SUCCEEDED, S.FAILED))


@pytest.mark.parametrize("kind", SCHEMAS)
def test_version_2_estimates_no_run_where_no_handler_could_have_run(kind: str) -> None:
    """Rows from before version 2 get executions 0 and no start while waiting for,
    or after being refused by, a person; a canceled effect's decision is not
    taken for an approval (it may have stopped a running handler: counted as run)."""
    schema = SCHEMAS[kind]
    lists = [(op, v) for _, op, v in status_lists(schema[schema.index(VERSION_2[kind]) :])]
    never_ran = values({S.REQUIRES_APPROVAL, S.READY, S.DENIED})
    canceled = values({S.CANCELED})
    assert lists == [("IN", never_ran), ("<>", canceled), ("IN", never_ran), ("<>", canceled)]


@pytest.mark.parametrize(("kind", "count"), [("postgres", 8), ("sqlite", 6)])
def test_no_status_list_goes_unchecked(kind: str, count: int) -> None:
    """Pinned: a new status list in a schema needs its own test above."""
    assert len(status_lists(SCHEMAS[kind])) == count


@pytest.mark.parametrize("kind", SAGA_SCHEMAS)
def test_the_saga_tables_list_exactly_the_saga_statuses(kind: str) -> None:
    """Version 3's check lists every SagaStatus; its open index exactly those with an owner."""
    lists = status_lists(SAGA_SCHEMAS[kind])
    [check] = [v for before, _, v in lists if "CHECK" in before[-40:]]
    [open_list] = [v for before, _, v in lists if "open_idx" in before]
    assert check == frozenset(s.value for s in SagaStatus)
    assert open_list == frozenset(s.value for s in SAGA_OPEN)
    assert len(lists) == 2
