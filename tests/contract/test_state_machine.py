"""Model-based test: random begin (plain or approval-gated)/claim/commit/heartbeat/
release/approve/deny/cancel/request-approval/clock
sequences from several logical workers, checked against a hand-written model
after every step, on every store.

Hypothesis rules are synchronous, so each machine owns an event loop and runs
the store's coroutines on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from agent_ledger import EffectError, EffectLedgerValidationError, EffectStatus, ToolCall
from agent_ledger.ledger import EffectLedger
from agent_ledger.stores.base import Held, NewEffect
from agent_ledger.testing import build_ledger
from tests.harness import (
    STORE_KINDS,
    StoreHarness,
    open_harness,
    require_mysql,
    require_postgres,
)

S = EffectStatus
T = TypeVar("T")
KEYS = range(2)
WORKERS = range(2)
STALE_MS = 1_000
#: Leases and claim windows the workers use: off, short, and longer than short.
WINDOWS = [0, STALE_MS, 2 * STALE_MS]


@dataclass
class ModelEffect:
    status: S = S.PROCESSING
    attempt: int = 1
    dedup: int = 0
    age_ms: float = 0.0
    result: object = None
    id: str = ""
    #: The holder's lease, as recorded at the insert or the last claim.
    lease_ms: int = STALE_MS
    executions: int = 1


@dataclass
class Model:
    effects: dict[int, ModelEffect] = field(default_factory=dict)
    # worker -> key -> (effect id, attempt) the worker believes it holds
    tokens: dict[int, dict[int, tuple[str, int]]] = field(default_factory=dict)


def new_effect(ledger: EffectLedger, key: int) -> NewEffect:
    call = ToolCall(workflow_id="model", tool=f"tool-{key}", args={"k": key})
    canon_key = ledger.idem_key(call)
    return NewEffect(
        idem_key=canon_key,
        workflow_id=call.workflow_id,
        call_id=None,
        tool=call.tool,
        args_canonical=f'{{"k":{key}}}',
        resource_id_canonical=None,
    )


class LedgerMachine(RuleBasedStateMachine):
    kind = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        try:
            self.harness: StoreHarness = self.run(
                self.stack.enter_async_context(open_harness(self.kind))
            )
        except BaseException:
            self.loop.close()  # teardown() will not run for a machine that never started
            raise
        self.ledger = build_ledger(self.harness.store)
        self.model = Model()
        self.news = {k: new_effect(self.ledger, k) for k in KEYS}

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.stack.aclose())
        self.loop.close()

    @initialize()
    def start(self) -> None:
        self.model = Model(tokens={w: {} for w in WORKERS})

    @rule(
        worker=st.sampled_from(WORKERS),
        key=st.sampled_from(KEYS),
        lease_ms=st.sampled_from(WINDOWS),
        gated=st.booleans(),
    )
    def begin(self, worker: int, key: int, lease_ms: int, gated: bool) -> None:
        new = self.news[key]._replace(lease_ms=lease_ms, requires_approval=gated)
        outcome = self.run(self.harness.store.begin(new))
        m = self.model.effects.get(key)
        if m is None:
            assert outcome.created
            if gated:  # waits for a person: nobody holds it, nothing ran
                m = ModelEffect(
                    status=S.REQUIRES_APPROVAL,
                    id=outcome.effect.id,
                    lease_ms=lease_ms,
                    executions=0,
                )
                self.model.effects[key] = m
            else:
                m = ModelEffect(id=outcome.effect.id, lease_ms=lease_ms)
                self.model.effects[key] = m
                self.model.tokens[worker][key] = (m.id, 1)
        else:
            # A replay: the store answers with exactly the recorded state.
            assert not outcome.created
            m.dedup += 1
            assert (outcome.effect.status, outcome.effect.attempt) == (m.status, m.attempt)
            if m.status is S.SUCCEEDED:
                assert outcome.effect.result == m.result

    @rule(
        worker=st.sampled_from(WORKERS),
        key=st.sampled_from(KEYS),
        stale_ms=st.sampled_from(WINDOWS),
    )
    def claim(self, worker: int, key: int, stale_ms: int) -> None:
        outcome = self.run(
            self.harness.store.claim(self.news[key].idem_key, stale_after_ms=stale_ms)
        )
        m = self.model.effects.get(key)
        if m is None:
            assert outcome.effect is None and not outcome.claimed
            return
        # A takeover needs the holder's lease to have run out: a caller's
        # shorter window never shortens it, and 0 on either side means never.
        claimable = m.status is S.READY or (
            m.status is S.PROCESSING
            and stale_ms > 0
            and m.lease_ms > 0
            and m.age_ms >= max(stale_ms, m.lease_ms)
        )
        assert outcome.claimed == claimable
        if claimable:
            m.status, m.attempt, m.age_ms = S.PROCESSING, m.attempt + 1, 0.0
            m.lease_ms, m.executions = stale_ms, m.executions + 1
            self.model.tokens[worker][key] = (m.id, m.attempt)

    @rule(worker=st.sampled_from(WORKERS), key=st.sampled_from(KEYS), success=st.booleans())
    def commit(self, worker: int, key: int, success: bool) -> None:
        token = self.model.tokens[worker].get(key)
        if token is None:
            return
        effect_id, attempt = token
        status = S.SUCCEEDED if success else S.FAILED
        result = f"w{worker}a{attempt}" if success else None
        won = self.run(
            self.harness.store.commit(
                effect_id,
                attempt=attempt,
                status=status,
                result_json=f'"{result}"' if success else None,
                error=None if success else EffectError("boom", "E"),
            )
        )
        m = self.model.effects[key]
        expected = m.status is S.PROCESSING and m.attempt == attempt
        assert won == expected, "fenced (older-attempt) commits must be rejected"
        if won:
            m.status, m.result = status, result

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: int) -> None:
        """One batch with every effect the worker believes it holds, as a ledger sends it."""
        tokens = self.model.tokens[worker]
        if not tokens:
            return
        batch = {key: Held(*token) for key, token in tokens.items()}
        outcome = self.run(self.harness.store.heartbeat(list(batch.values())))
        assert not outcome.busy, "no other transaction holds a row lock here"
        for key, held in batch.items():
            m = self.model.effects[key]
            alive = held in outcome.refreshed
            assert alive == (m.status is S.PROCESSING and m.attempt == held.attempt)
            if alive:
                m.age_ms = 0.0

    @rule(worker=st.sampled_from(WORKERS), key=st.sampled_from(KEYS), for_approval=st.booleans())
    def release(self, worker: int, key: int, for_approval: bool) -> None:
        token = self.model.tokens[worker].get(key)
        if token is None:
            return
        released = self.run(
            self.harness.store.release(token[0], attempt=token[1], for_approval=for_approval)
        )
        m = self.model.effects[key]
        assert released == (m.status is S.PROCESSING and m.attempt == token[1]), "fenced"
        if released:
            # Given back unrun (to a person, with for_approval: the holder's hold):
            # its claim's execution is taken back; the heartbeat stays.
            m.status = S.REQUIRES_APPROVAL if for_approval else S.READY
            m.executions -= 1

    @rule(
        key=st.sampled_from(KEYS), action=st.sampled_from(["request", "approve", "deny", "cancel"])
    )
    def decide(self, key: int, action: str) -> None:
        idem_key = self.news[key].idem_key
        methods: dict[str, Callable[[str], Awaitable[bool]]] = {
            "request": self.ledger.request_approval,
            "approve": self.ledger.approve,
            "deny": self.ledger.deny,
            "cancel": self.ledger.cancel,
        }
        method = methods[action]
        m = self.model.effects.get(key)
        if action == "request" and m is not None and m.status is S.PROCESSING:
            # Not the holder (this ledger began nothing): an error, never a silent False.
            with pytest.raises(EffectLedgerValidationError, match="held by another caller"):
                self.run(method(idem_key))
            return
        moved = self.run(method(idem_key))
        allowed = {
            # Never from processing: a running handler cannot be sent back.
            "request": ({S.READY}, S.REQUIRES_APPROVAL),
            "approve": ({S.REQUIRES_APPROVAL}, S.READY),
            "deny": ({S.REQUIRES_APPROVAL}, S.DENIED),
            "cancel": ({S.PROCESSING, S.REQUIRES_APPROVAL, S.READY}, S.CANCELED),
        }[action]
        expected = m is not None and m.status in allowed[0]
        assert moved == expected
        if moved and m is not None:
            m.status = allowed[1]

    @rule(ms=st.sampled_from([300, 700, 1_200]))
    def advance_clock(self, ms: int) -> None:
        self.run(self.harness.age(ms))
        for m in self.model.effects.values():
            m.age_ms += ms

    @invariant()
    def store_matches_model(self) -> None:
        assert self.run(self.harness.raw_count()) == len(self.model.effects), "no effect is lost"
        for key, m in self.model.effects.items():
            effect = self.run(self.harness.store.find(self.news[key].idem_key))
            assert effect is not None
            assert (
                effect.status,
                effect.attempt,
                effect.dedup_count,
                effect.lease_ms,
                effect.executions,
            ) == (m.status, m.attempt, m.dedup, m.lease_ms, m.executions)
            assert (effect.started_at is not None) == (m.executions > 0)
            assert effect.id == m.id
            if m.status is S.SUCCEEDED:
                assert effect.result == m.result
            assert (effect.completed_at is not None) == m.status.is_terminal


def run_model(kind: str, max_examples: int, steps: int) -> None:
    """Drive a fresh LedgerMachine class for ``kind`` through hypothesis."""
    if kind == "postgres":
        require_postgres()
    if kind == "mysql":
        require_mysql()
    machine = type(f"LedgerMachine_{kind}", (LedgerMachine,), {"kind": kind})
    machine.TestCase.settings = settings(  # type: ignore[attr-defined]
        max_examples=max_examples, stateful_step_count=steps, deadline=None
    )
    machine.TestCase().runTest()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_store_follows_the_model(kind: str) -> None:
    """Random operation sequences never diverge from the model, on each store.

    Plain pytest draws 40 sequences of up to 30 steps per store (a few seconds);
    the slow tier's tests/reliability/test_model_long.py draws 400 of up to 40."""
    run_model(kind, max_examples=40, steps=30)
