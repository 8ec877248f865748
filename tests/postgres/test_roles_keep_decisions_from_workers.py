"""PostgreSQL itself refuses a decision by anyone but an approver (issue 28).

Real login roles on the real server, granted the role set `install_roles`
creates: the worker's approve fails with SQLSTATE 42501 and changes nothing,
while everything the engine does (begin, claim, heartbeat, commit, budgets,
sagas, asking for approval) works as the worker; an approver's decision is
recorded under the session's identity whatever name the client sends; the
requester is stamped from the session; with separation of duty the database
refuses a requester's own decision. On the plain and the partitioned table.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from agent_ledger import (
    ApprovalPendingError,
    Budget,
    EffectLedger,
    EffectStatus,
    RunOptions,
    ToolCall,
)
from agent_ledger.approvals import Channel, DecisionAction, DecisionOutcome
from agent_ledger.codes import DecisionCode
from agent_ledger.deciding import decide, effect_intent, expire_overdue
from agent_ledger.effects import CommitSucceeded, Effect
from agent_ledger.errors import EffectLedgerPermissionError
from agent_ledger.stores.base import Held
from agent_ledger.stores.postgres import PostgresStore
from agent_ledger.testing import build_ledger
from tests.harness import DSN
from tests.postgres.roles_world import RoleWorld, role_world

PAY = ToolCall(workflow_id="wf-roles", tool="payments.send", args={"to": "acme", "cents": 9_900})
GATED = RunOptions(requires_approval=True, wait_for_approval=False)


# The partitioned table in the slow tier, as the contract suite runs it.
@pytest.fixture(
    params=[False, pytest.param(True, marks=pytest.mark.slow)], ids=["plain", "partitioned"]
)
async def world(request: pytest.FixtureRequest) -> AsyncIterator[RoleWorld]:
    async with role_world(partitioned=request.param) as made:
        yield made


async def _ledger(world: RoleWorld, who: str) -> tuple[EffectLedger, PostgresStore]:
    store = await world.store(who)
    return build_ledger(store), store


async def _waiting(ledger: EffectLedger, call: ToolCall = PAY) -> Effect:
    with pytest.raises(ApprovalPendingError):
        await ledger.run(call, lambda e: {"paid": e.args["cents"]}, GATED)
    effect = await ledger.store.find(ledger.idem_key(call))
    assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL
    return effect


async def _ask(
    store: PostgresStore, idem_key: str, requested_by: str | None, deadline_ms: int | None
) -> None:
    """The worker records its approval request (as the engine does for a policy)."""
    await store.note_request(
        idem_key, requested_by=requested_by, policy_version=None, deadline_ms=deadline_ms
    )


def _refused(exc: BaseException, code: DecisionCode) -> None:
    assert isinstance(exc, EffectLedgerPermissionError), exc
    assert exc.code == code.value
    cause = exc.__cause__
    assert isinstance(cause, psycopg.errors.InsufficientPrivilege)
    assert cause.sqlstate == "42501"


async def test_the_workers_approve_fails_with_42501_and_nothing_changes(world: RoleWorld) -> None:
    ledger, store = await _ledger(world, "worker")
    before = await _waiting(ledger)
    with pytest.raises(EffectLedgerPermissionError) as approving:
        await ledger.approve(before.idem_key, by="alice")
    _refused(approving.value, DecisionCode.NOT_AN_APPROVER)
    assert world.roles.approver in str(approving.value)  # which role to grant
    assert world.logins["worker"] in str(approving.value)
    with pytest.raises(EffectLedgerPermissionError) as denying:
        await ledger.deny(before.idem_key, "no", by="alice")
    _refused(denying.value, DecisionCode.NOT_AN_APPROVER)
    with pytest.raises(EffectLedgerPermissionError) as deciding:
        await decide(
            store,
            before.idem_key,
            action=DecisionAction.APPROVE,
            principal="alice",
            channel=Channel.CONSOLE,
            shown_intent=effect_intent(before, None),
        )
    _refused(deciding.value, DecisionCode.NOT_AN_APPROVER)
    after = await world.admin.find(before.idem_key)
    assert after == before
    assert await world.admin.decision_attempts(before.idem_key) == []


async def test_raw_sql_from_the_worker_cannot_decide_either(world: RoleWorld) -> None:
    ledger, _ = await _ledger(world, "worker")
    effect = await _waiting(ledger)
    table = sql.Identifier(world.schema, "agent_ledger_effects")
    async with await psycopg.AsyncConnection.connect(world.dsn("worker"), autocommit=True) as conn:
        for target in ("ready", "denied", "succeeded", "failed", "processing"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                await conn.execute(
                    sql.SQL("UPDATE {} SET status = %s, decided_by = 'alice' WHERE id = %s").format(
                        table
                    ),
                    (target, effect.id),
                )
            assert refused.value.sqlstate == "42501"
            assert refused.value.diag.constraint_name == "not_an_approver"
        # Nor can it insert an effect that is already decided, or delete one.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (idem_key, workflow_id, tool, args_canonical, status)"
                    " VALUES ('k-forged', 'wf', 'payments.send', '{{}}', 'ready')"
                ).format(table)
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # its decision columns
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (idem_key, workflow_id, tool, args_canonical, status,"
                    " decided_by) VALUES ('k-forged-2', 'wf', 't', '{{}}', 'processing', 'alice')"
                ).format(table)
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(table), (effect.id,))
    # Neither the worker nor an approver may change what an effect runs.
    for who in ("worker", "approver"):
        async with await psycopg.AsyncConnection.connect(world.dsn(who), autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(
                    sql.SQL(
                        "UPDATE {} SET args_canonical = '{{\"cents\": 1}}' WHERE id = %s"
                    ).format(table),
                    (effect.id,),
                )
    assert await world.admin.find(effect.idem_key) == effect


async def test_everything_the_engine_does_works_as_the_worker(world: RoleWorld) -> None:
    ledger, store = await _ledger(world, "worker")
    ran: list[str] = []

    @ledger.tool("email.send")
    async def send(to: str) -> str:
        ran.append(to)
        return f"sent to {to}"

    # run (begin, claim, commit), its replay, inside a budget.
    async with ledger.workflow("wf-budget", budget=Budget(usd=5.0, tool_calls=3)):
        assert await send("a@example.com") == "sent to a@example.com"
        assert await send("a@example.com") == "sent to a@example.com"
    state = await ledger.budget("wf-budget")
    assert state is not None and state.spent.tool_calls == 1
    assert ran == ["a@example.com"]
    # begin, heartbeat, commit by hand.
    begun = await ledger.begin(ToolCall(workflow_id="wf", tool="by.hand", args={"n": 1}))
    beat = await store.heartbeat([Held(begun.effect.id, begun.effect.attempt)])
    assert Held(begun.effect.id, begun.effect.attempt) in beat.refreshed
    assert await ledger.commit(
        begun.effect.id, CommitSucceeded("done"), attempt=begun.effect.attempt
    )
    # a saga's steps.
    async with ledger.saga("order-1"):
        await send("b@example.com")
    saga = await store.get_saga("order-1")
    assert ran == ["a@example.com", "b@example.com"]
    assert saga is not None and saga.status.value == "completed"
    # the holder sends its own effect to a person, and a waiting effect may be
    # canceled (a decider it names is stamped with the session's identity).
    held = await ledger.begin(ToolCall(workflow_id="wf", tool="by.hand", args={"n": 2}))
    assert await ledger.request_approval(held.effect.idem_key)
    assert await ledger.cancel(held.effect.idem_key, reason="not needed", by="someone")
    canceled = await store.find(held.effect.idem_key)
    assert canceled is not None and canceled.status is EffectStatus.CANCELED
    assert canceled.decided_by == world.logins["worker"]


async def test_an_approver_decides_as_its_session_whatever_by_says(world: RoleWorld) -> None:
    worker, _ = await _ledger(world, "worker")
    approver, _ = await _ledger(world, "approver")
    effect = await _waiting(worker)
    assert await approver.approve(effect.idem_key, by="mallory", note="checked")
    decided = await world.admin.find(effect.idem_key)
    assert decided is not None and decided.status is EffectStatus.READY
    assert decided.decided_by == world.logins["approver"]
    assert getattr(decided.history[-1], "by", None) == world.logins["approver"]
    table = sql.Identifier(world.schema, "agent_ledger_effects")
    ((stored,),) = await world.sql(
        sql.SQL("SELECT history -> -1 FROM {} WHERE id = %s").format(table), decided.id
    )
    assert isinstance(stored, dict) and stored["claimed_by"] == "mallory"
    # The worker's next run claims the approved effect and runs it.
    assert await worker.run(PAY, lambda e: {"paid": e.args["cents"]}, GATED) == {"paid": 9_900}
    ran = await world.admin.find(effect.idem_key)  # the worker's claim keeps the decider
    assert ran is not None and ran.decided_by == world.logins["approver"]
    # A denial, through decide(): the audit trail keeps the person the
    # application authenticated; the effect, the database's identity.
    other = await _waiting(
        worker, ToolCall(workflow_id="wf-roles", tool="payments.send", args={"to": "x", "cents": 1})
    )
    store = await world.store("approver")
    result = await decide(
        store,
        other.idem_key,
        action=DecisionAction.DENY,
        principal="alice@example.com",
        channel=Channel.CONSOLE,
        shown_intent=effect_intent(other, None),
        note="not this one",
    )
    assert result.accepted and result.effect is not None
    assert result.effect.decided_by == world.logins["approver"]
    (attempt,) = await store.decision_attempts(other.idem_key)
    assert attempt.principal == "alice@example.com"


async def test_set_role_to_the_group_is_recorded_as_the_login(world: RoleWorld) -> None:
    worker, _ = await _ledger(world, "worker")
    effect = await _waiting(worker)
    table = sql.Identifier(world.schema, "agent_ledger_effects")
    group = sql.Identifier(world.roles.approver)
    update = sql.SQL(
        "UPDATE {} SET status = 'ready', decided_by = 'x', decided_at = now() WHERE id = %s"
    ).format(table)
    async with await psycopg.AsyncConnection.connect(world.dsn("approver")) as conn:
        await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(group))
        await conn.execute(update, (effect.id,))
        await conn.commit()
    decided = await world.admin.find(effect.idem_key)
    assert decided is not None and decided.decided_by == world.logins["approver"]


async def test_requested_by_is_the_session_whatever_the_client_writes(world: RoleWorld) -> None:
    worker, store = await _ledger(world, "worker")
    effect = await _waiting(worker)
    request = await store.note_request(
        effect.idem_key, requested_by="the-ceo", policy_version="p1", deadline_ms=None
    )
    assert request.requested_by == world.logins["worker"]
    table = sql.Identifier(world.schema, "agent_ledger_approvals")
    async with await psycopg.AsyncConnection.connect(world.dsn("worker"), autocommit=True) as conn:
        await conn.execute(
            sql.SQL("UPDATE {} SET requested_by = 'the-ceo' WHERE idem_key = %s").format(table),
            (effect.idem_key,),
        )
        # A renewed request (insert-or-update of every field but the key) works,
        # and stays the worker's own.
        await conn.execute(
            sql.SQL(
                "INSERT INTO {} AS a (idem_key, requested_by, policy_version, deadline_at)"
                " VALUES (%s, 'the-ceo', 'p2', NULL) ON CONFLICT (idem_key) DO UPDATE SET"
                " requested_by = EXCLUDED.requested_by, policy_version = EXCLUDED.policy_version,"
                " deadline_at = EXCLUDED.deadline_at, escalated_at = NULL,"
                " created_at = clock_timestamp()"
            ).format(table),
            (effect.idem_key,),
        )
    again = await store.approval_request(effect.idem_key)
    assert again is not None and again.requested_by == world.logins["worker"]
    assert again.policy_version == "p2"


async def test_reopen_is_a_decision(world: RoleWorld) -> None:
    worker, _ = await _ledger(world, "worker")
    approver, _ = await _ledger(world, "approver")
    effect = await _waiting(worker)
    assert await worker.cancel(effect.idem_key, reason="later")
    with pytest.raises(EffectLedgerPermissionError) as refused:
        await worker.reopen(effect.idem_key, by="bob", reason="go")
    _refused(refused.value, DecisionCode.NOT_AN_APPROVER)
    assert (await world.admin.find(effect.idem_key)).status is EffectStatus.CANCELED  # type: ignore[union-attr]
    assert await approver.reopen(effect.idem_key, by="bob", reason="go")
    reopened = await world.admin.find(effect.idem_key)
    assert reopened is not None and reopened.status is EffectStatus.READY
    assert reopened.decided_by == world.logins["approver"]


async def test_anyone_may_deny_an_approval_past_its_deadline_but_not_before(
    world: RoleWorld,
) -> None:
    worker, store = await _ledger(world, "worker")
    effect = await _waiting(worker)
    await _ask(store, effect.idem_key, None, 60_000)
    with pytest.raises(EffectLedgerPermissionError):
        await worker.deny(effect.idem_key, "too early", by="w")
    table = sql.Identifier(world.schema, "agent_ledger_approvals")
    await world.sql(
        sql.SQL("UPDATE {} SET deadline_at = %s WHERE idem_key = %s").format(table),
        datetime.now(UTC) - timedelta(minutes=1),
        effect.idem_key,
    )
    (denied,) = await expire_overdue(store)
    assert denied.status is EffectStatus.DENIED
    assert denied.decided_by == world.logins["worker"]


async def test_a_login_without_a_role_gets_a_clear_error(world: RoleWorld) -> None:
    ledger, _ = await _ledger(world, "nobody")
    with pytest.raises(EffectLedgerPermissionError) as refused:
        await ledger.run(PAY, lambda e: "x")
    assert refused.value.code is None
    assert "worker role" in str(refused.value)


async def test_separation_of_duty_refuses_the_requesters_own_decision() -> None:
    async with role_world(separate_duty=True) as world:
        both, store = await _ledger(world, "both")
        effect = await _waiting(both)
        await _ask(store, effect.idem_key, "x", None)
        with pytest.raises(EffectLedgerPermissionError) as refused:
            await both.approve(effect.idem_key, by="someone-else")
        _refused(refused.value, DecisionCode.SELF_DECISION)
        # Through decide() (the console's path) the refusal is in the audit trail.
        with pytest.raises(EffectLedgerPermissionError):
            await decide(
                store,
                effect.idem_key,
                action=DecisionAction.APPROVE,
                principal="bob",
                channel=Channel.CONSOLE,
                shown_intent=effect_intent(effect, await store.approval_request(effect.idem_key)),
            )
        # The first refusal (channel code) is audited too; bob's is the console's.
        (attempt,) = [
            a for a in await world.admin.decision_attempts(effect.idem_key) if a.principal == "bob"
        ]
        assert (attempt.principal, attempt.outcome, attempt.reason_code) == (
            "bob",
            DecisionOutcome.REFUSED,
            DecisionCode.SELF_DECISION,
        )
        assert await world.admin.find(effect.idem_key) == effect
        approver, _ = await _ledger(world, "approver")
        assert await approver.approve(effect.idem_key, by="x")


async def test_without_separation_of_duty_a_requester_who_approves_may_decide() -> None:
    async with role_world(separate_duty=False) as world:
        both, store = await _ledger(world, "both")
        effect = await _waiting(both)
        await _ask(store, effect.idem_key, None, None)
        assert await both.approve(effect.idem_key)
        # And the setting is the schema's: switched on by running install again.
        assert (
            await world.admin.install_roles(
                prefix=world.roles.owner[: -len("owner")], separate_duty=True
            )
        ).separate_duty
        other = await _waiting(
            both, ToolCall(workflow_id="wf", tool="payments.send", args={"n": 2})
        )
        await _ask(store, other.idem_key, None, None)
        with pytest.raises(EffectLedgerPermissionError) as refused:
            await both.approve(other.idem_key)
        _refused(refused.value, DecisionCode.SELF_DECISION)


async def test_a_worker_cannot_stand_in_its_own_pg_has_role(world: RoleWorld) -> None:
    """The guard runs as the caller; a caller's function named like the built-in,
    in a schema it puts first, must not answer for it (the functions fix search_path)."""
    worker, _ = await _ledger(world, "worker")
    effect = await _waiting(worker)
    login = world.logins["worker"]
    evil = sql.Identifier(f"{login}_evil")
    await world.sql(
        sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(evil, sql.Identifier(login))
    )
    table = sql.Identifier(world.schema, "agent_ledger_effects")
    async with await psycopg.AsyncConnection.connect(world.dsn("worker"), autocommit=True) as conn:
        for signature in ("name, text, text", "text, text, text"):
            await conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}.pg_has_role(" + signature + ") RETURNS boolean"
                    " LANGUAGE sql AS 'SELECT true'"
                ).format(evil)
            )
        await conn.execute(sql.SQL("SET search_path = {}, pg_catalog").format(evil))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute(
                sql.SQL("UPDATE {} SET status = 'ready' WHERE id = %s").format(table),
                (effect.id,),
            )
    assert await world.admin.find(effect.idem_key) == effect


async def test_with_separation_of_duty_a_decision_needs_a_recorded_requester() -> None:
    async with role_world(separate_duty=True) as world:
        worker, store = await _ledger(world, "worker")
        approver, _ = await _ledger(world, "approver")
        unasked = await _waiting(worker)
        # run() recorded the request (stamped with the worker's login); a request
        # lost (a process dying between its two statements) leaves none:
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DELETE FROM {} WHERE idem_key = %s").format(
                    sql.Identifier(world.schema, "agent_ledger_approvals")
                ),
                (unasked.idem_key,),
            )
        with pytest.raises(EffectLedgerPermissionError) as refused:
            await approver.approve(unasked.idem_key)
        _refused(refused.value, DecisionCode.UNKNOWN_REQUESTER)
        assert await world.admin.find(unasked.idem_key) == unasked
        # The worker cannot move its request to another effect either.
        await _ask(store, unasked.idem_key, None, None)
        table = sql.Identifier(world.schema, "agent_ledger_approvals")
        async with await psycopg.AsyncConnection.connect(
            world.dsn("worker"), autocommit=True
        ) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(
                    sql.SQL("UPDATE {} SET idem_key = 'elsewhere' WHERE idem_key = %s").format(
                        table
                    ),
                    (unasked.idem_key,),
                )
        assert await approver.approve(unasked.idem_key)
        # A parked attempt (the system asked) needs no recorded requester.
        parked = await _waiting(worker, ToolCall(workflow_id="wf", tool="payments.send", args={}))
        effects = sql.Identifier(world.schema, "agent_ledger_effects")
        await world.sql(
            sql.SQL(
                'UPDATE {} SET error = \'{{"message": "silent", "code": "ambiguous_attempt"}}\''
                " WHERE id = %s"
            ).format(effects),
            parked.id,
        )
        assert await approver.approve(parked.idem_key)


async def test_only_an_approver_resolves_a_parked_attempt(world: RoleWorld) -> None:
    worker, _ = await _ledger(world, "worker")
    approver, _ = await _ledger(world, "approver")
    effect = await _waiting(worker)
    effects = sql.Identifier(world.schema, "agent_ledger_effects")
    await world.sql(  # as a waiter's park leaves it: the holder went silent mid-run
        sql.SQL(
            'UPDATE {} SET error = \'{{"message": "silent", "code": "ambiguous_attempt"}}\''
            " WHERE id = %s"
        ).format(effects),
        effect.id,
    )
    parked = await world.admin.find(effect.idem_key)
    assert parked is not None and parked.parked
    with pytest.raises(EffectLedgerPermissionError) as refused:
        await worker.resolve(effect.idem_key, result={"paid": True}, by="ops")
    _refused(refused.value, DecisionCode.NOT_AN_APPROVER)
    assert await world.admin.find(effect.idem_key) == parked
    assert await approver.resolve(effect.idem_key, result={"paid": True}, by="ops")
    resolved = await world.admin.find(effect.idem_key)
    assert resolved is not None and resolved.status is EffectStatus.SUCCEEDED
    assert resolved.decided_by == world.logins["approver"]


async def test_purge_is_the_owners_not_the_workers(world: RoleWorld) -> None:
    worker, store = await _ledger(world, "worker")
    assert await worker.run(ToolCall(workflow_id="wf", tool="t", args={}), lambda e: "ok") == "ok"
    done = frozenset({EffectStatus.SUCCEEDED})
    with pytest.raises(EffectLedgerPermissionError) as refused:
        await store.purge(older_than=timedelta(0), statuses=done)
    assert refused.value.code is None and "owner role" in str(refused.value)
    owner = await world.store("owner")
    assert await owner.purge(older_than=timedelta(0), statuses=done) == 1
