"""A person's decision, bound to what they were shown and recorded however it ends.

``decide()`` is the one path every channel takes (the console, a signed link,
Slack, the CLI, code): it refuses a decision on an effect that no longer
waits, whose intent hash differs from the one the person saw, whose deadline
passed, or (with separation of duty) made by the principal who asked for it;
otherwise it makes the transition with ``ApprovalStore.decide``, exactly one
of any number of concurrent deciders winning. Every attempt, accepted or
refused, lands in the audit trail with its principal, channel and reason
code. Who may decide which tool is the caller's rule (the console's
``authorize``); a refusal by it is recorded here too (:func:`refuse`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from agent_ledger.approvals import (
    ApprovalRequest,
    Channel,
    DecisionAction,
    DecisionOutcome,
    NewDecisionAttempt,
    UsedLink,
    intent_hash,
)
from agent_ledger.codes import DecisionCode, ErrorCode
from agent_ledger.decisions import NO_RESULT, call_approval_hook, check_decision
from agent_ledger.effects import Effect, EffectError, JSONValue, Settlement, storable_text
from agent_ledger.errors import DecisionRefusedError, EffectLedgerValidationError
from agent_ledger.keys import canonical_json
from agent_ledger.metrics import EXPIRED, OUTCOMES, approval_left, decided, refused
from agent_ledger.observability import log_effect
from agent_ledger.options import LedgerHooks
from agent_ledger.status import EffectStatus
from agent_ledger.stores.approval_base import ApprovalStore, DecideRequest
from agent_ledger.stores.base import Decision, Store

__all__ = [
    "EXPIRY_DECIDER",
    "MAX_NOTE_CHARS",
    "RUN_PRINCIPAL",
    "ApprovalSweep",
    "DecisionResult",
    "approval_store",
    "approved_intent_differs",
    "decide",
    "decide_from_cli",
    "decide_in_code",
    "earlier_round",
    "effect_intent",
    "expire_overdue",
    "refuse",
    "refuse_changed_intent",
    "sweep_approvals",
]

#: The longest note a decision may carry, in characters; a longer one is refused.
MAX_NOTE_CHARS: Final = 2000
#: An expired approval's denial reason.
_EXPIRED_MESSAGE: Final = "expired: nobody decided before the approval's deadline"
#: Who the receipt says decided an expired approval.
EXPIRY_DECIDER: Final = "agent-ledger (deadline)"

_TARGETS: Final = {
    DecisionAction.APPROVE: EffectStatus.READY,
    DecisionAction.DENY: EffectStatus.DENIED,
}


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """How a decision attempt ended: ``accepted`` (this attempt made the transition)
    or refused with ``reason``; ``message`` says it for a person."""

    accepted: bool
    reason: DecisionCode
    message: str
    effect: Effect | None


def approval_store(store: Store) -> ApprovalStore:
    """``store`` as an ``ApprovalStore``; a clear error if it is not one."""
    if not isinstance(store, ApprovalStore):
        raise EffectLedgerValidationError(
            f"{type(store).__name__} keeps no approvals (schema version 4's decision "
            "audit trail and links): every store of agent-ledger 0.3 does; a store of "
            "your own must implement ApprovalStore (stores/approval_base.py)",
            field="store",
        )
    return store


def effect_intent(
    effect: Effect, request: ApprovalRequest | None, *, attempt: int | None = None
) -> str:
    """The intent hash of ``effect`` as it would run, under its request's policy
    version, for its current approval round (``attempt``: another round's)."""
    return intent_hash(
        tool=effect.tool,
        workflow_id=effect.workflow_id,
        args_canonical=effect.args_canonical,
        policy_version=None if request is None else request.policy_version,
        attempt=effect.attempt if attempt is None else attempt,
    )


def earlier_round(effect: Effect, request: ApprovalRequest | None, shown: str) -> bool:
    """True when ``shown`` is ``effect``'s intent for one of its earlier attempts:
    a stale link or form from a round that has since run."""
    return any(
        effect_intent(effect, request, attempt=earlier) == shown
        for earlier in range(effect.attempt - 1, max(effect.attempt - 1000, 0) - 1, -1)
    )


def already_decided(effect: Effect) -> str:
    """ "already decided by X at T" (or why the effect no longer waits)."""
    if effect.decided_by and effect.decided_at is not None:
        when = effect.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"already decided by {effect.decided_by} at {when} (now {effect.status.value})"
    return f"no longer waits for a person: it is {effect.status.value}"


async def refuse(
    store: Store,
    attempt: NewDecisionAttempt,
    reason: DecisionCode,
    message: str,
    effect: Effect | None = None,
) -> DecisionResult:
    """Record a refused attempt and say why; nothing else changes."""
    await approval_store(store).record_attempt(
        attempt, outcome=DecisionOutcome.REFUSED, reason=reason
    )
    refused(attempt.channel, attempt.action, reason)
    return DecisionResult(False, reason, message, effect)


class _Principal:
    """``decide(decided_by=...)``'s default: the principal's name."""


_PRINCIPAL: Final = _Principal()


async def decide(
    store: Store,
    idem_key: str,
    *,
    action: DecisionAction,
    principal: str,
    channel: Channel,
    shown_intent: str | None,
    note: str | None = None,
    result: JSONValue = NO_RESULT,
    error: EffectError | None = None,
    link: UsedLink | None = None,
    separation_of_duty: bool = False,
    now: datetime | None = None,
    expected_attempt: int | None = None,
    decided_by: str | _Principal | None = _PRINCIPAL,
) -> DecisionResult:
    """Approve, deny or resolve ``idem_key`` as ``principal`` through ``channel``.

    ``shown_intent`` is the intent hash the person was shown; the console,
    links and Slack always send one, and a decision without one is refused
    from those channels (code and the CLI may omit it: they read the effect
    they decide). ``now`` (default: this process's UTC clock) judges the
    request's deadline; the sweep, :func:`expire_overdue`, judges it by the
    store's clock. ``expected_attempt``: refused as ``already_decided`` if the
    effect has moved on to another attempt. ``decided_by``: the name the
    receipt keeps (default: ``principal``; code may leave it unnamed).
    A channel that shows nothing (code, the CLI) records the intent hash of
    the effect it decided, so the run can check it (:func:`approved_intent_differs`).
    """
    approvals = approval_store(store)
    if not isinstance(principal, str) or not principal.strip():
        raise EffectLedgerValidationError(
            "principal must be the authenticated decider's name, a non-empty string",
            field="principal",
        )
    note = storable_text(note) if note else None
    if note is not None and len(note) > MAX_NOTE_CHARS:
        # Audited without the note: an oversized text is not kept anywhere.
        return await refuse(
            store,
            NewDecisionAttempt(idem_key, principal, channel, action, shown_intent, None),
            DecisionCode.NOTE_TOO_LONG,
            f"a note may have at most {MAX_NOTE_CHARS:,} characters (this one has "
            f"{len(note):,}): nothing changed",
        )
    attempt = NewDecisionAttempt(idem_key, principal, channel, action, shown_intent, note)
    effect = await store.find(idem_key)
    if effect is None:
        return await refuse(
            store, attempt, DecisionCode.UNKNOWN_EFFECT, "no effect has this key: nothing changed"
        )
    request = await approvals.approval_request(idem_key)
    if effect.status is EffectStatus.REQUIRES_APPROVAL and _overdue(request, now):
        # This process's clock says so; the store's (the database's) decides:
        # the sweep denies only what is overdue by it.
        expired = await _expired(store, idem_key, effect)
        if expired is not None:
            return await refuse(store, attempt, DecisionCode.EXPIRED, _EXPIRED_REFUSAL, expired)
        effect = await store.find(idem_key) or effect
    if effect.status is not EffectStatus.REQUIRES_APPROVAL:
        return await refuse(
            store, attempt, DecisionCode.ALREADY_DECIDED, already_decided(effect), effect
        )
    if expected_attempt is not None and effect.attempt != expected_attempt:
        return await refuse(
            store,
            attempt,
            DecisionCode.ALREADY_DECIDED,
            f"the effect moved on to attempt {effect.attempt}, not {expected_attempt}: "
            "nothing changed",
            effect,
        )
    current = effect_intent(effect, request)
    if (
        shown_intent is not None
        and shown_intent != current
        and earlier_round(effect, request, shown_intent)
    ):
        return await refuse(
            store,
            attempt,
            DecisionCode.EARLIER_ATTEMPT,
            f"this approval was for an earlier attempt: the effect has run since and "
            f"waits again (attempt {effect.attempt}): nothing changed. Read its receipt "
            "and decide again.",
            effect,
        )
    if shown_intent is None and channel not in _BOUND_CHANNELS:
        attempt = dataclasses.replace(attempt, intent_hash=current)
    if (shown_intent is None and channel in _BOUND_CHANNELS) or (
        shown_intent is not None and shown_intent != current
    ):
        return await refuse(
            store,
            attempt,
            DecisionCode.INTENT_MISMATCH,
            "what would run differs from what you were shown (tool, workflow, arguments "
            "or policy version): nothing changed. Reload the receipt and decide again.",
            effect,
        )
    if separation_of_duty and request is not None and _same_person(request.requested_by, principal):
        return await refuse(
            store,
            attempt,
            DecisionCode.SELF_DECISION,
            f"{principal} asked for this approval and may not decide it (separation of duty)",
            effect,
        )
    target, result_json, error = _outcome(action, effect, result, error, note)
    if action is DecisionAction.RESOLVE and not effect.parked:
        return await refuse(
            store,
            attempt,
            DecisionCode.NOT_PARKED,
            "this effect waits for an approval, not for an outcome: approve or deny it",
            effect,
        )
    outcome = await approvals.decide(
        DecideRequest(
            idem_key=idem_key,
            target=target,
            # A denial's reason is its error (callers see it) and the audit
            # row's note; the settlement keeps who, as ``deny()`` always did.
            decision=Decision(
                by=principal if isinstance(decided_by, _Principal) else decided_by,
                note=None if action is DecisionAction.DENY else note,
            ),
            attempt=attempt,
            expected_attempt=effect.attempt,
            only_parked=action is DecisionAction.RESOLVE,
            result_json=result_json,
            error=error,
            link=link,
        )
    )
    if outcome.link_used:
        return await refuse(
            store, attempt, DecisionCode.LINK_USED, "this link has already been used", effect
        )
    if outcome.effect is None and request is not None and request.deadline_at is not None:
        # The store's settle refuses an approval past the deadline by its own
        # clock, which this process's may lag: deny it as expired, and say so.
        expired = await _expired(store, idem_key, effect)
        if expired is not None:
            return await refuse(store, attempt, DecisionCode.EXPIRED, _EXPIRED_REFUSAL, expired)
    if outcome.effect is None:
        now_effect = await store.find(idem_key) or effect
        return await refuse(
            store, attempt, DecisionCode.ALREADY_DECIDED, already_decided(now_effect), now_effect
        )
    approval_left(effect, outcome.effect, OUTCOMES[target])
    decided(outcome.effect, channel, action)
    log_effect(logging.INFO, f"effect decided by {principal} via {channel.value}", outcome.effect)
    return DecisionResult(True, DecisionCode.DECIDED, f"{action.value}d", outcome.effect)


async def decide_in_code(
    store: Store,
    idem_key: str,
    *,
    action: DecisionAction,
    principal: str,
    channel: Channel,
    decided_by: str | None,
    note: str | None,
    expected_attempt: int | None,
    result: JSONValue = NO_RESULT,
    error: EffectError | None = None,
) -> bool:
    """``ledger.approve/deny/resolve`` and the CLI's: :func:`decide`, answered as
    0.2.x's API answers. True: this call decided. False: nothing to decide (no
    such key, no longer waiting, another attempt, someone decided first).
    Raised: resolve of an effect that waits for an approval
    (``EffectLedgerValidationError``, ``field="idem_key"``, as before), and any
    other refusal (``DecisionRefusedError``: a passed deadline). Every attempt is
    in the audit trail either way, on every store agent-ledger ships; a store of
    your own that keeps no approvals (no ``ApprovalStore``) gets the bare
    compare-and-set, unaudited, as before schema version 4."""
    if not isinstance(store, ApprovalStore):
        return await _settle_unaudited(
            store,
            idem_key,
            action=action,
            decided_by=decided_by,
            note=note,
            expected_attempt=expected_attempt,
            result=result,
            error=error,
        )
    outcome = await decide(
        store,
        idem_key,
        action=action,
        principal=principal,
        channel=channel,
        shown_intent=None,
        note=note,
        result=result,
        error=error,
        expected_attempt=expected_attempt,
        decided_by=decided_by,
    )
    if outcome.accepted:
        return True
    if outcome.reason in (DecisionCode.ALREADY_DECIDED, DecisionCode.UNKNOWN_EFFECT):
        return False
    if outcome.reason is DecisionCode.NOT_PARKED:
        tool = outcome.effect.tool if outcome.effect is not None else "?"
        raise EffectLedgerValidationError(
            f"effect {idem_key[:12]}… ({tool}) waits for an approval, not because an "
            "attempt's outcome is unknown: its handler never ran, so there is no outcome "
            "to resolve. approve() or deny() it. Nothing changed.",
            field="idem_key",
        )
    raise DecisionRefusedError(
        f"cannot {action.value} effect {idem_key[:12]}…: {outcome.message} "
        f"(reason code {outcome.reason.value})",
        reason=outcome.reason.value,
        effect=outcome.effect,
    )


async def decide_from_cli(
    store: Store,
    idem_key: str,
    action: DecisionAction,
    *,
    by: str,
    note: str | None,
    expected_attempt: int | None,
    result: JSONValue = NO_RESULT,
    error: EffectError | None = None,
) -> bool:
    """``agent-ledger approve/deny/resolve/review``: :func:`decide_in_code` through the
    channel ``cli``, as ``by`` (the ``--by`` name, or the OS user: the CLI trusts
    the process that runs it to say who it is, as the database credentials it
    holds already do)."""
    checked = check_decision(by, note)
    if not checked.by:
        raise EffectLedgerValidationError("--by must name who decides", field="by")
    return await decide_in_code(
        store,
        idem_key,
        action=action,
        principal=checked.by,
        channel=Channel.CLI,
        decided_by=checked.by,
        note=checked.note,
        expected_attempt=expected_attempt,
        result=result,
        error=error,
    )


async def _settle_unaudited(
    store: Store,
    idem_key: str,
    *,
    action: DecisionAction,
    decided_by: str | None,
    note: str | None,
    expected_attempt: int | None,
    result: JSONValue,
    error: EffectError | None,
) -> bool:
    """``decide_in_code`` on a store that keeps no audit trail: ``Store.settle`` alone."""
    effect = await store.find(idem_key)
    if effect is None:
        return False
    target, result_json, error = _outcome(action, effect, result, error, note)
    if (
        action is DecisionAction.RESOLVE
        and effect.status is EffectStatus.REQUIRES_APPROVAL
        and not effect.parked
    ):
        raise EffectLedgerValidationError(
            f"effect {idem_key[:12]}… ({effect.tool}) waits for an approval, not because an "
            "attempt's outcome is unknown: its handler never ran, so there is no outcome "
            "to resolve. approve() or deny() it. Nothing changed.",
            field="idem_key",
        )
    # A denial's reason is its error (callers see it); the settlement keeps who.
    kept = None if action is DecisionAction.DENY else note
    moved = await store.settle(
        idem_key,
        target=target,
        decision=Decision(by=decided_by, note=kept),
        expected_attempt=expected_attempt,
        only_parked=action is DecisionAction.RESOLVE,
        result_json=result_json,
        error=error,
    )
    if moved is not None:
        approval_left(effect, moved, OUTCOMES[target])
        decided(moved, Channel.CODE, action)
        log_effect(logging.INFO, f"effect settled: {target.value}", moved)
    return moved is not None


#: More attempts than one effect ever gets (refused ones included).
_ALL_ATTEMPTS: Final = 1_000_000
#: Who the audit trail names for the run's own refusal of a changed intent.
RUN_PRINCIPAL: Final = "agent-ledger (run)"


async def approved_intent_differs(
    store: Store, effect: Effect, policy_version: str | None, tx: object | None = None
) -> str | None:
    """Why the approved ``effect``, just claimed to run, must not run: the intent hash
    its last accepted approval was bound to differs from the intent of the effect as
    it would run now (its stored tool, workflow and args; the running ledger's
    ``policy_version``, or the request's when the ledger names none). None: it may run
    (it matches, or no approval through :func:`decide` is recorded: an effect
    reopened or approved by a store of your own)."""
    if not isinstance(store, ApprovalStore):
        return None
    # Every row (oldest first): a page could end before the last approval.
    attempts = await store.decision_attempts(effect.idem_key, limit=_ALL_ATTEMPTS, tx=tx)
    approved = [
        a
        for a in attempts
        if a.outcome is DecisionOutcome.ACCEPTED and a.action is DecisionAction.APPROVE
    ]
    if not approved or approved[-1].intent_hash is None:
        return None
    request = await store.approval_request(effect.idem_key, tx=tx)
    version = policy_version
    if version is None and request is not None:
        version = request.policy_version
    # The round the person approved: the attempt of the last approval in the
    # history (a claim has moved effect.attempt on since).
    rounds = [
        event.attempt
        for event in effect.history
        if isinstance(event, Settlement) and event.status is EffectStatus.READY
    ]
    now = intent_hash(
        tool=effect.tool,
        workflow_id=effect.workflow_id,
        args_canonical=effect.args_canonical,
        policy_version=version,
        attempt=rounds[-1] if rounds else effect.attempt,
    )
    if now == approved[-1].intent_hash:
        return None
    return (
        f"approved by {approved[-1].principal} for intent {approved[-1].intent_hash[:12]}…, "
        f"but it would run as {now[:12]}… (tool, workflow, arguments or policy version "
        "changed): not run, sent back to a person"
    )


async def refuse_changed_intent(store: Store, effect: Effect, run_intent_note: str) -> None:
    """Record, in the audit trail, that the run refused an approval whose intent changed."""
    refused(Channel.CODE, DecisionAction.APPROVE, DecisionCode.INTENT_MISMATCH)
    if not isinstance(store, ApprovalStore):
        return
    attempt = NewDecisionAttempt(
        effect.idem_key,
        RUN_PRINCIPAL,
        Channel.CODE,
        DecisionAction.APPROVE,
        None,
        storable_text(run_intent_note),
    )
    await store.record_attempt(
        attempt, outcome=DecisionOutcome.REFUSED, reason=DecisionCode.INTENT_MISMATCH
    )


#: Channels that show a person an effect: their decisions must say what they saw.
_BOUND_CHANNELS: Final = frozenset({Channel.CONSOLE, Channel.LINK, Channel.SLACK})


def _same_person(requested_by: str | None, principal: str) -> bool:
    """Separation of duty's test: names compared without case (``Alice@Example.com``
    is ``alice@example.com``) and surrounding spaces."""
    return requested_by is not None and (
        requested_by.strip().casefold() == principal.strip().casefold()
    )


_EXPIRED_REFUSAL: Final = "the approval's deadline has passed: the effect was denied as expired"


async def _expired(store: Store, idem_key: str, effect: Effect) -> Effect | None:
    """Deny ``idem_key`` as expired if the store's clock says its deadline passed;
    the effect denied as expired (now or by another), or None if it is not."""
    await expire_overdue(store, only=idem_key)
    now = await store.find(idem_key) or effect
    expired = (
        now.status is EffectStatus.DENIED
        and now.error is not None
        and now.error.code == ErrorCode.APPROVAL_EXPIRED
    )
    return now if expired else None


def _overdue(request: ApprovalRequest | None, now: datetime | None) -> bool:
    if request is None or request.deadline_at is None:
        return False
    return request.deadline_at <= (now or datetime.now(UTC))


def _outcome(
    action: DecisionAction,
    effect: Effect,
    result: JSONValue,
    error: EffectError | None,
    note: str | None,
) -> tuple[EffectStatus, str | None, EffectError | None]:
    """The settle target, result and error an action records."""
    if action is DecisionAction.APPROVE:
        return EffectStatus.READY, None, None
    if action is DecisionAction.DENY:
        return EffectStatus.DENIED, None, EffectError(note or "denied", ErrorCode.DENIED)
    if (result is NO_RESULT) == (error is None):
        raise EffectLedgerValidationError(
            "resolve takes exactly one of result= (the side effect happened) or error= "
            "(it failed). Nothing changed.",
            field="result",
        )
    if error is not None:
        return EffectStatus.FAILED, None, error
    text = canonical_json(result, field="result", sort_keys=False).decode()
    return EffectStatus.SUCCEEDED, text, None


async def expire_overdue(store: Store, *, only: str | None = None) -> list[Effect]:
    """Deny, with reason ``expired``, every effect still waiting past its deadline
    (by the store's clock); return those this call denied. Silence is never consent.

    ``only``: just this key (the console expiring one effect as it reads it).
    """
    approvals = approval_store(store)
    denied: list[Effect] = []
    for request in await approvals.overdue_approvals():
        if only is not None and request.idem_key != only:
            continue
        waiting = await store.find(request.idem_key)
        if waiting is None or waiting.status is not EffectStatus.REQUIRES_APPROVAL:
            continue
        if waiting.parked:
            continue  # an ambiguous attempt is never denied by a clock
        # At the attempt read: an effect approved, run and parked meanwhile
        # (a later attempt) is not denied by this request's deadline.
        moved = await store.settle(
            request.idem_key,
            target=EffectStatus.DENIED,
            decision=Decision(by=EXPIRY_DECIDER, note="the approval's deadline passed"),
            error=EffectError(
                "expired: nobody decided before the deadline", ErrorCode.APPROVAL_EXPIRED
            ),
            expected_attempt=waiting.attempt,
        )
        if moved is not None:
            approval_left(waiting, moved, EXPIRED)
            log_effect(logging.INFO, "approval expired: effect denied", moved)
            denied.append(moved)
    return denied


@dataclass(frozen=True, slots=True)
class ApprovalSweep:
    """What one :func:`sweep_approvals` did."""

    #: Denied as expired (past their deadline, undecided).
    expired: list[Effect]
    #: Whose escalation hook this sweep fired (once per request, across sweepers).
    escalated: list[Effect]


async def sweep_approvals(store: Store, hooks: LedgerHooks) -> ApprovalSweep:
    """Deny every undecided approval past its deadline (reason ``expired``), then
    fire ``hooks.on_approval_escalation`` for every request that has used
    ``hooks.escalate_after`` of its time to its deadline and was not escalated yet.

    Each escalation is stamped (``escalated_at``, one compare-and-set on the
    request) before its hook is called, so of any number of concurrent sweepers
    exactly one calls it, once per request: at most once (a sweeper that dies
    between the stamp and the call, or a hook that raises, is not retried; the
    failure is logged). A request renewed later (the effect sent back to a
    person) is a new request and escalates again.
    """
    approvals = approval_store(store)
    expired = await expire_overdue(store)
    escalated: list[Effect] = []
    hook = hooks.on_approval_escalation
    if hook is None:
        return ApprovalSweep(expired, escalated)
    for request in await approvals.escalations_due(fraction=float(hooks.escalate_after)):
        if not await approvals.mark_escalated(request.idem_key, created_at=request.created_at):
            continue  # another sweeper fired it
        effect = await store.find(request.idem_key)
        if effect is None:
            continue
        log_effect(logging.INFO, "approval escalated", effect)
        escalated.append(effect)
        await call_approval_hook(hook, effect, "on_approval_escalation")
    return ApprovalSweep(expired, escalated)
