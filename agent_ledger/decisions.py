"""People's decisions on effects: request approval, approve, deny, resolve, cancel,
reopen; the sweep that parks ambiguous attempts; and the steps that withdraw
an effect for a rollback (a saga's), which the layers above reach here rather
than driving the store themselves. Also the one decision a holder makes on its
own effect: sending it to a person before running it.

Each decision is one compare-and-set in the store (``Store.transition``,
``Store.settle`` or ``Store.reopen``), so two operators acting on the same
stale screen cannot both win: the second gets False. ``expected_attempt``
narrows approve, deny and resolve to the attempt the person saw, so a
decision made on an older run of the effect changes nothing. Who decided,
and their note or reason, go on the receipt and into its history.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from agent_ledger.codes import ErrorCode
from agent_ledger.effects import Effect, EffectError, JSONValue, storable_text
from agent_ledger.errors import EffectLedgerValidationError, require_str
from agent_ledger.metrics import (
    OUTCOMES,
    approval_entered,
    approval_left,
    recording,
    taken_over,
)
from agent_ledger.names import check_name_length
from agent_ledger.observability import effect_fields, log_effect, logger
from agent_ledger.options import LedgerHooks, ResolvedRunOptions
from agent_ledger.status import REOPENABLE, EffectStatus
from agent_ledger.stores.approval_base import ApprovalStore
from agent_ledger.stores.base import (
    ClaimOutcome,
    Decision,
    EffectQuery,
    Held,
    NewEffect,
    SchemaCheck,
    Store,
    transition_sources,
)

__all__ = [
    "AMBIGUOUS_REASON",
    "NO_RESULT",
    "WAITING_FOR_A_PERSON",
    "ApprovalAsk",
    "BegunAttempts",
    "Decisions",
    "ambiguous_error",
    "cancel_counted",
    "cancel_if_waiting",
    "check_decision",
    "close_unbegun",
    "expected_attempt",
    "note_approval",
    "notify_approval_required",
    "park_if_silent",
    "take_over_and_cancel",
]

#: The statuses of an effect that waits for a person: asked, or approved and not yet claimed.
WAITING_FOR_A_PERSON: Final = frozenset({EffectStatus.REQUIRES_APPROVAL, EffectStatus.READY})


class BegunAttempts:
    """The effects this ledger's ``begin()`` handed to its caller to run, not yet committed.

    So that 0.2.x's worker flow, ``begin()`` then ``request_approval(key)``
    with no attempt, is recognised as the holder's own step: the caller whose
    begin made it the holder may send the effect to a person before running
    the tool. "The caller" is the asyncio task that called ``begin()``: another
    task sharing the ledger object (a reviewer, a watchdog) is anyone else,
    and is refused for a running effect, since parking it would have the tool
    run again after the approval. Bounded (the oldest are forgotten first): a
    worker that begins effects it never commits, or asks from another task
    (each sync call runs as a task of its own), passes ``attempt=``.
    """

    LIMIT: Final = 4096

    def __init__(self) -> None:
        self._by_key: OrderedDict[str, tuple[Held, weakref.ref[asyncio.Task[Any]] | None]] = (
            OrderedDict()
        )
        self._key_of: dict[str, str] = {}

    def remember(self, effect: Effect) -> None:
        self.forget(effect.id)
        self._by_key.pop(effect.idem_key, None)
        task = asyncio.current_task()
        caller = None if task is None else weakref.ref(task)
        self._by_key[effect.idem_key] = (Held(effect.id, effect.attempt), caller)
        self._key_of[effect.id] = effect.idem_key
        while len(self._by_key) > self.LIMIT:
            _, (oldest, _caller) = self._by_key.popitem(last=False)
            self._key_of.pop(oldest.effect_id, None)

    def forget(self, effect_id: str) -> None:
        key = self._key_of.pop(effect_id, None)
        if key is not None:
            self._by_key.pop(key, None)

    def attempt(self, idem_key: str) -> int | None:
        """The attempt begin() handed out for ``idem_key``, to the task asking only."""
        entry = self._by_key.get(idem_key)
        if entry is None:
            return None
        held, caller = entry
        task = asyncio.current_task()
        if caller is None or task is None or caller() is not task:
            return None
        return held.attempt


class Decisions:
    """The decision steps of one ledger."""

    def __init__(self, store: Store, schema: SchemaCheck) -> None:
        self._store = store
        self._schema = schema
        #: What this ledger's begin() handed out: see :class:`BegunAttempts`.
        self.begun = BegunAttempts()

    async def request_approval(
        self,
        idem_key: str,
        hooks: LedgerHooks,
        *,
        attempt: int | None = None,
        ask: ApprovalAsk | None = None,
    ) -> bool:
        require_str(idem_key, "idem_key")
        if attempt is not None and (type(attempt) is not int or not 1 <= attempt <= MAX_ATTEMPT):
            raise EffectLedgerValidationError(
                "attempt must be a positive int (the attempt begin() gave you: "
                f"result.effect.attempt) of at most {MAX_ATTEMPT}, got {attempt!r}",
                field="attempt",
            )
        named = attempt is not None
        if attempt is None:
            attempt = self.begun.attempt(idem_key)
        ask = ask or ApprovalAsk()
        if attempt is not None:
            return await self._hold(idem_key, attempt, hooks, named=named, ask=ask)
        # Anyone but the holder: ready -> requires_approval only. The
        # decision table has no processing -> requires_approval (see
        # agent_ledger.status), so the store's compare-and-set refuses a
        # running effect, and we say so instead of returning False.
        await self._schema.ensure()
        before = await self._store.find(idem_key)
        if before is not None and before.status is EffectStatus.READY:
            # A new request, recorded before the move: no decision can see
            # the effect waiting under the old request's (maybe past) deadline.
            await note_approval(self._store, idem_key, ask, renew=True)
        moved = await self._move(idem_key, EffectStatus.REQUIRES_APPROVAL, None, None)
        if moved is not None:
            approval_entered(moved)
            await notify_approval_required(moved, hooks)
            return True
        found = await self._store.find(idem_key)
        if found is not None and found.status is EffectStatus.PROCESSING:
            raise EffectLedgerValidationError(
                f"effect {idem_key[:12]}… ({found.tool}) is processing at attempt "
                f"{found.attempt}, held by another caller whose handler may be running: an "
                "approval could not stop it. Only its holder can send it to a person, before "
                "running the tool: request_approval(key, attempt=result.effect.attempt) from "
                "the worker whose begin() returned it. To make a call wait for a person "
                "before it runs, create it that way: RunOptions(requires_approval=True) or "
                "the requires_approval policy hook. Nothing changed.",
                field="idem_key",
            )
        return False

    async def _hold(
        self, idem_key: str, attempt: int, hooks: LedgerHooks, *, named: bool, ask: ApprovalAsk
    ) -> bool:
        """The holder's own step: its ``processing`` effect, at its attempt, goes to a
        person before the tool runs (``status.HOLD``). Fenced: a holder that was
        taken over (or, having ``named`` its attempt, finished) is told so, and
        changes nothing. A finished effect this ledger's begin() handed out
        answers False, as for anyone: it can run no more."""
        await self._schema.ensure()
        found = await self._store.find(idem_key)
        if found is None:
            return False
        if found.status is EffectStatus.PROCESSING and found.attempt == attempt:
            # Recorded while we hold it: nobody can decide a processing effect.
            await note_approval(self._store, idem_key, ask, renew=True)
            if await self._store.release(found.id, attempt=attempt, for_approval=True):
                self.begun.forget(found.id)
                held = await self._store.find(idem_key)
                if held is not None:
                    approval_entered(held)
                    log_effect(logging.INFO, "effect sent for approval by its holder", held)
                    await notify_approval_required(held, hooks)
                return True
            found = await self._store.find(idem_key) or found
        self.begun.forget(found.id)
        if found.status is EffectStatus.REQUIRES_APPROVAL and found.attempt == attempt:
            return False  # already waiting for a person: nothing can run it meanwhile
        if found.status.is_terminal and not named:
            return False
        raise EffectLedgerValidationError(
            f"attempt {attempt} no longer holds effect {idem_key[:12]}… ({found.tool}): it "
            f"is {found.status.value} at attempt {found.attempt} (taken over, finished or "
            "decided meanwhile). Do not run the tool for this attempt. Nothing changed.",
            field="attempt",
        )

    async def park_stale(self, hooks: LedgerHooks) -> list[Effect]:
        """Park every effect whose holder went silent for its own lease after its
        handler started under ``on_stale="park"``; return those this call parked.

        ``hooks.on_approval_required`` is called for each, as when a caller parks
        one: the sweep exists for when no caller is around to page anybody."""
        await self._schema.ensure()
        parked: list[Effect] = []
        before: tuple[datetime, str] | None = None
        while True:
            page = await self._store.list_effects(
                EffectQuery(status=EffectStatus.PROCESSING, limit=_SWEEP_PAGE, before=before)
            )
            for effect in page:
                if effect.park_attempt != effect.attempt:
                    continue
                outcome = await park_if_silent(self._store, effect.idem_key)
                if outcome.claimed and outcome.effect is not None:
                    log_effect(logging.WARNING, "effect parked by a sweep", outcome.effect)
                    parked.append(outcome.effect)
                    await notify_approval_required(outcome.effect, hooks)
            if len(page) < _SWEEP_PAGE:
                return parked
            before = (page[-1].created_at, page[-1].id)

    async def cancel(self, idem_key: str, *, reason: str | None, by: str | None) -> bool:
        error = EffectError(message=_reason(reason, "canceled"), code=ErrorCode.CANCELED)
        decision = _decision(by, None)
        require_str(idem_key, "idem_key")
        await self._schema.ensure()
        moved = await cancel_counted(self._store, idem_key, error, decision, None)
        if moved is not None:
            log_effect(logging.INFO, "effect moved to canceled", moved)
        return moved is not None

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> bool:
        require_str(idem_key, "idem_key")
        by, reason = _required_text(by, "by"), _required_text(reason, "reason")
        await self._schema.ensure()
        moved = await self._store.reopen(idem_key, by=by, reason=reason)
        if moved is not None:
            log_effect(logging.INFO, f"effect reopened by {by}: {reason}", moved)
            return True
        # Nothing moved: say why when it never could (a read, off the happy path).
        found = await self._store.find(idem_key)
        if found is not None and found.status not in REOPENABLE and found.status.is_terminal:
            raise EffectLedgerValidationError(
                _NOT_REOPENED[found.status].format(key=idem_key[:12], tool=found.tool),
                field="idem_key",
            )
        return False

    async def _move(
        self,
        idem_key: str,
        target: EffectStatus,
        error: EffectError | None,
        decision: Decision | None,
    ) -> Effect | None:
        require_str(idem_key, "idem_key")
        await self._schema.ensure()
        moved = await self._store.transition(
            idem_key, target=target, error=error, decision=decision
        )
        if moved is not None:
            log_effect(logging.INFO, f"effect moved to {target.value}", moved)
        return moved


@dataclass(frozen=True, slots=True)
class ApprovalAsk:
    """What an approval request records beside its effect: who asked, under which
    policy version, and how long a person has to decide (ms; None: no deadline)."""

    requested_by: str | None = None
    policy_version: str | None = None
    deadline_ms: int | None = None

    @classmethod
    def of(cls, opts: ResolvedRunOptions, hooks: LedgerHooks) -> ApprovalAsk:
        """The request a call with these options and hooks makes."""
        return cls(opts.principal, hooks.approval_policy_version, opts.approval_deadline_ms)


async def note_approval(store: Store, idem_key: str, ask: ApprovalAsk, *, renew: bool) -> None:
    """Record the approval request of ``idem_key`` (schema version 4): the first one
    (``renew=False``: insert-or-get, a repeated note changes nothing) or a new one
    replacing the last (``renew=True``). Called only by the caller whose step sent
    the effect to a person, so once per request; nothing on a run that needs no
    person. A store that keeps no approvals (one of your own) records nothing."""
    if not isinstance(store, ApprovalStore):
        return
    step = store.renew_request if renew else store.note_request
    await step(
        idem_key,
        requested_by=ask.requested_by,
        policy_version=ask.policy_version,
        deadline_ms=ask.deadline_ms,
    )


async def notify_approval_required(effect: Effect, hooks: LedgerHooks) -> None:
    """Call ``hooks.on_approval_required(effect)`` (sync or async); its failure is
    logged, never raised.

    The effect is already stored as waiting for approval: a broken
    notification must not abort the caller, who would otherwise retry into
    the same pending effect and never hear back.
    """
    hook = hooks.on_approval_required
    if hook is not None:
        await call_approval_hook(hook, effect, "on_approval_required")


async def call_approval_hook(
    hook: Callable[[Effect], Awaitable[None] | None], effect: Effect, name: str
) -> None:
    """Call an approval hook named ``name`` on ``effect`` (sync or async); its
    failure is logged, never raised: the effect still waits for approval."""
    try:
        pending = hook(effect)
        if inspect.isawaitable(pending):
            await pending
    except Exception:
        logger.exception(
            f"{name} hook raised; the effect still waits for approval",
            extra=effect_fields(effect),
        )


def _decision(by: str | None, note: str | None) -> Decision:
    for value, name in ((by, "by"), (note, "note")):
        if value is not None and not isinstance(value, str):
            raise EffectLedgerValidationError(
                f"{name} must be a string or None, got {type(value).__name__}", field=name
            )
    if by:
        check_name_length(by, "by")
    return Decision(
        by=storable_text(by) if by else None, note=storable_text(note) if note else None
    )


#: Why ``reopen`` refuses the terminal statuses it never takes an effect from.
_NOT_REOPENED: Final = {
    EffectStatus.SUCCEEDED: (
        "effect {key}… ({tool}) succeeded: its result is the receipt, and reopening it "
        "would run the side effect again. Nothing changed; a new request needs a new "
        "call (a new key)."
    ),
    EffectStatus.DENIED: (
        "effect {key}… ({tool}) was denied: a denial stands, and reopening it would run "
        "what a person refused. Nothing changed; a new decision needs a new call (a new key)."
    ),
}


def _required_text(value: object, name: str, saying: str | None = None) -> str:
    if not isinstance(value, str) or not value.strip():
        what = saying or ("who reopens the effect" if name == "by" else "why")
        raise EffectLedgerValidationError(
            f"{name} is required: a non-empty string saying {what}, got {value!r}",
            field=name,
        )
    if name == "by":  # a name, stored and listed; a reason is free text
        check_name_length(value, name)
    return storable_text(value)


#: The largest attempt a store keeps (PostgreSQL's ``integer`` column): a larger
#: ``expected_attempt`` can match no effect, and is refused as bad input.
MAX_ATTEMPT: Final = 2**31 - 1


def expected_attempt(value: object) -> int | None:
    """``expected_attempt`` checked: None, or a positive int in a store's range."""
    return _expected_attempt(value)


def check_decision(by: str | None, note: str | None) -> Decision:
    """``by`` and ``note`` of a decision checked (strings or None; ``by`` a name)."""
    return _decision(by, note)


def _expected_attempt(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= MAX_ATTEMPT:
        raise EffectLedgerValidationError(
            "expected_attempt must be a positive int (the attempt you saw) of at most "
            f"{MAX_ATTEMPT}, got {value!r}",
            field="expected_attempt",
        )
    return value


#: The reason a parked effect carries (its ``error.message``).
AMBIGUOUS_REASON: Final = (
    "the worker running the handler stopped heartbeating after the handler started and "
    "before its outcome was recorded, so whether the side effect happened is unknown; the tool "
    "runs with on_stale='park', so it is not run again automatically. Check with the "
    "downstream system, then resolve() it with what happened, approve() it to run it "
    "again, or deny() it."
)


# -- withdrawing an effect for a rollback --------------------------------------------


async def cancel_if_waiting(store: Store, idem_key: str, error: EffectError, *, by: str) -> bool:
    """Cancel the effect only while it waits for a person (``requires_approval``,
    or approved and not yet claimed); True if this call canceled it. One
    compare-and-set: a read then an unconditional cancel would cancel an
    effect a worker claimed in between, under its running handler, whose
    side effect then stands with nothing to undo it."""
    moved = await cancel_counted(store, idem_key, error, Decision(by=by), WAITING_FOR_A_PERSON)
    return moved is not None


async def cancel_counted(
    store: Store,
    idem_key: str,
    error: EffectError,
    decision: Decision,
    sources: frozenset[EffectStatus] | None,
) -> Effect | None:
    """``Store.transition`` to ``canceled`` (from ``sources``, default every status a
    decision may cancel), knowing whether it left ``requires_approval``.

    When metrics are counted, the cancel from ``requires_approval`` is tried
    first on its own, then from the other statuses: each is one
    compare-and-set, so the step that moved the effect says where from, and
    the pending-approval count goes down exactly when it should. Uncounted,
    it is the one compare-and-set it always was.
    """
    target = EffectStatus.CANCELED
    if not recording():
        return await store.transition(
            idem_key, target=target, error=error, decision=decision, sources=sources
        )
    allowed = transition_sources(target, sources)
    asked = frozenset({EffectStatus.REQUIRES_APPROVAL}) & allowed
    rest = allowed - asked
    for _ in range(_CANCEL_TRIES):
        waiting = await store.find(idem_key)  # to time the wait only
        if asked:
            moved = await store.transition(
                idem_key, target=target, error=error, decision=decision, sources=asked
            )
            if moved is not None:
                approval_left(waiting, moved, OUTCOMES[target])
                return moved
        if rest:
            moved = await store.transition(
                idem_key, target=target, error=error, decision=decision, sources=rest
            )
            if moved is not None:
                return moved
        now = await store.find(idem_key)
        if now is None or now.status not in allowed:
            return None  # nothing to cancel from: the answer stands
        # Moved between the two steps to a status it may be canceled from: again.
    # Raced that often: cancel as before, uncounted (the count may drift by one).
    return await store.transition(
        idem_key, target=target, error=error, decision=decision, sources=sources
    )


#: How often ``cancel_counted`` tries the split compare-and-set before giving up on counting.
_CANCEL_TRIES: Final = 3
#: The decision action of each status ``Decisions._settle`` moves an effect to.
_ACTIONS: Final = {
    EffectStatus.READY: "approve",
    EffectStatus.DENIED: "deny",
    EffectStatus.SUCCEEDED: "resolve",
    EffectStatus.FAILED: "resolve",
}


async def close_unbegun(
    store: Store, idem_key: str, *, workflow_id: str, tool: str, error: EffectError
) -> bool:
    """Give a call that never began an effect that is already ``canceled``, so a
    worker that wakes up later cannot begin it; True if this call made it
    (False: the effect appeared meanwhile). Inserted waiting for a person, then
    canceled from there: it is never ``processing``, so nothing can run it."""
    new = NewEffect(
        idem_key=idem_key,
        workflow_id=workflow_id,
        call_id=None,
        tool=tool,
        args_canonical="{}",
        resource_id_canonical=None,
        requires_approval=True,
    )
    began = await store.begin(new)
    if not began.created:
        return False
    closed = await store.transition(idem_key, target=EffectStatus.CANCELED, error=error)
    return closed is not None


async def park_if_silent(store: Store, idem_key: str) -> ClaimOutcome:
    """Park the effect for a person if its holder went silent for a whole lease
    after its handler started under ``on_stale="park"`` (judged by the store's
    clock). A window of 1 ms: the holder's own lease (the longer) decides."""
    outcome = await store.park(idem_key, stale_after_ms=1, error=ambiguous_error())
    if outcome.claimed and outcome.effect is not None:
        approval_entered(outcome.effect)
    return outcome


async def take_over_and_cancel(
    store: Store, idem_key: str, lease_ms: int, error: EffectError
) -> ClaimOutcome:
    """Cancel an effect whose holder went silent for its whole lease.

    Taken over first, as any caller would (one fenced claim, judged stale by
    the store's clock, which refuses a run whose handler started under
    ``on_stale="park"``), then canceled as its new holder. A bare cancel
    could land just after a paused holder woke and recorded its handler's
    start: a run that must be parked, not canceled, with its side effect
    never undone. After the claim the old holder can no longer record a
    start, heartbeat or commit. No handler runs for the claim, so the cancel
    takes its execution back (``executions`` counts handler starts).
    """
    outcome = await store.claim(idem_key, stale_after_ms=1, lease_ms=lease_ms)
    if outcome.claimed and outcome.effect is not None:
        taken_over(outcome.effect.tool)
        await store.commit(
            outcome.effect.id,
            attempt=outcome.effect.attempt,
            status=EffectStatus.CANCELED,
            result_json=None,
            error=error,
            ends_try=False,
            started=False,
        )
    return outcome


def ambiguous_error() -> EffectError:
    """The reason a parked effect carries (its history's ``Parked`` names the attempt)."""
    return EffectError(AMBIGUOUS_REASON, ErrorCode.AMBIGUOUS_ATTEMPT)


class _NoResult:
    """``resolve()`` was given no ``result=`` (None is a result: a handler may return it)."""

    def __repr__(self) -> str:
        return "<no result>"


_NO_RESULT: Final[JSONValue] = _NoResult()  # type: ignore[assignment]
#: How many processing effects a sweep reads at a time.
_SWEEP_PAGE: Final = 500


def _reason(reason: str | None, what: str) -> str:
    if reason is None:
        return what
    if not isinstance(reason, str):
        raise EffectLedgerValidationError(
            f"reason must be a string or None, got {type(reason).__name__}", field="reason"
        )
    return reason or what


#: ``resolve()``'s default for ``result``: none given.
NO_RESULT: Final = _NO_RESULT
