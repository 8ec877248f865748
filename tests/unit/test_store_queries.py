"""The SQL stores' statements and parameters: one builder, two dialects that agree."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import orjson

from agent_ledger.effects import EffectError
from agent_ledger.status import CLAIMABLE, EffectStatus
from agent_ledger.stores import _postgres_queries as pg
from agent_ledger.stores import _sqlite_queries as lite
from agent_ledger.stores._params import (
    LIST_FILTER_NAMES,
    claim_params,
    list_params,
    release_params,
    transition_params,
)
from agent_ledger.stores.base import Decision, EffectQuery
from agent_ledger.stores.postgres import _DIALECT as PG
from agent_ledger.stores.sqlite import _DIALECT as LITE

AT = datetime(2024, 1, 2, tzinfo=UTC)


def _names(statement: str, style: str) -> set[str]:
    pattern = r"%\((\w+)\)s" if style == "pg" else r"(?<!:):(\w+)"
    return set(re.findall(pattern, statement))


def test_both_dialects_have_every_list_filter() -> None:
    assert set(pg.LIST_FILTERS) == set(lite.LIST_FILTERS) == set(LIST_FILTER_NAMES)


def test_list_params_fill_exactly_the_fragments_used() -> None:
    query = EffectQuery(
        workflow_id="w",
        tool="t",
        status=EffectStatus.READY,
        since=AT,
        until=AT,
        before=(AT, "0b0e4f5e-1111-4222-8333-444455556666"),
        idem_key_prefix="ab",
        call_id="c1",
        error_code="handler_timeout",
        min_duration=timedelta(milliseconds=5),
        max_duration=timedelta(seconds=5),
        limit=7,
    )
    for dialect, filters, order, style, extra in (
        (PG, pg.LIST_FILTERS, pg.LIST_ORDER, "pg", set()),
        # SqliteStore passes its clock's now for the handler time of running effects.
        (LITE, lite.LIST_FILTERS, lite.LIST_ORDER, "lite", {"now"}),
    ):
        names, params = list_params(dialect, query)
        assert names == list(LIST_FILTER_NAMES)
        used = set().union(*(_names(filters[n], style) for n in names), _names(order, style))
        assert used == set(params) | extra
    assert list_params(LITE, EffectQuery()) == ([], {"limit": 100})
    _, params = list_params(LITE, EffectQuery(since=AT))
    assert params["since"] == int(AT.timestamp() * 1_000_000)


def test_transition_params_cover_each_dialects_statement() -> None:
    for dialect, statement, style, extra in (
        (PG, pg.TRANSITION, "pg", set()),
        (LITE, lite.TRANSITION, "lite", {"now"}),
    ):
        params = transition_params(
            dialect,
            "k",
            target=EffectStatus.DENIED,
            error=EffectError("no", "denied"),
            decision=Decision(by="ana"),
        )
        assert _names(statement, style) <= set(params) | extra


def test_no_statement_retypes_a_status() -> None:
    """Statuses reach SQL as parameters from EffectStatus, never as literals."""
    for module in (pg, lite):
        for name, statement in vars(module).items():
            if name.isupper() and isinstance(statement, str):
                for status in EffectStatus:
                    assert f"'{status.value}'" not in statement, (module.__name__, name)


def test_claims_take_their_sources_from_claimable() -> None:
    for dialect in (PG, LITE):
        params = claim_params(dialect, "k", stale_after_ms=5, lease_ms=None)
        assert params["processing"] == EffectStatus.PROCESSING.value
        claimable = params["claimable"]
        values = claimable if isinstance(claimable, list) else orjson.loads(str(claimable))
        assert set(values) == {s.value for s in CLAIMABLE}
    pg_params = set(claim_params(PG, "k", stale_after_ms=5, lease_ms=None))
    assert _names(pg.CLAIM_IN_TRANSACTION, "pg") == pg_params
    # Outside a transaction the claim bounds its own lock wait (PostgresStore adds it).
    assert _names(pg.CLAIM, "pg") == pg_params | {"lock_timeout"}
    assert _names(lite.CLAIM, "lite") == set(
        claim_params(LITE, "k", stale_after_ms=5, lease_ms=None)
    ) | {"now", "seen_us"}  # seen_us: the holder's file (stores/_sqlite_holders.py)


def test_release_params_cover_each_dialects_statement() -> None:
    params = release_params("0b0e4f5e-1111-4222-8333-444455556666", attempt=2)
    assert (params["processing"], params["ready"]) == ("processing", "ready")
    assert _names(pg.RELEASE, "pg") == set(params)
    assert _names(lite.RELEASE, "lite") == set(params) | {"now"}


def test_approvals_take_only_requires_approval_to_ready() -> None:
    """The transition's sources for ready leave out processing: that edge is a release."""
    for dialect in (PG, LITE):
        params = transition_params(
            dialect, "k", target=EffectStatus.READY, error=None, decision=None
        )
        sources = params["sources"]
        values = sources if isinstance(sources, list) else orjson.loads(str(sources))
        assert values == [EffectStatus.REQUIRES_APPROVAL.value]
