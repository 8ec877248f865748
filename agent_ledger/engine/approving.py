"""What a claim must check before a handler runs for a call that needs a person.

Two checks on an effect a call has just claimed (a claim after waiting, or a
takeover), both sending it back to a person instead of running it: a call
that needs approval runs only an effect someone decided
(:func:`park_if_unapproved`: a row written as processing or ready by hand,
without a decision, never runs a gated call), and a decided effect runs only
the intent its approval was bound to (:func:`approval_still_holds`). Apart
from acquiring.py so each engine module fits on a screen.
"""

from __future__ import annotations

import logging

from agent_ledger.deciding import approved_intent_differs, refuse_changed_intent
from agent_ledger.decisions import ApprovalAsk, note_approval, notify_approval_required
from agent_ledger.effects import Effect
from agent_ledger.engine.cancellation import carry_through
from agent_ledger.engine.preparing import Prepared
from agent_ledger.errors import EffectLedgerInvariantError, EffectLedgerValidationError
from agent_ledger.metrics import approval_entered
from agent_ledger.observability import log_effect
from agent_ledger.stores.base import NewEffect, Store

__all__ = [
    "approval_ask",
    "approval_in_transaction",
    "approval_still_holds",
    "park_if_unapproved",
]


async def approval_still_holds(store: Store, prepared: Prepared, claimed: Effect) -> Effect | None:
    """The approval of an effect we just claimed still binds what would run: None.

    Otherwise (the intent its approval was bound to differs from the effect as
    it would run: tool, workflow, args or the ledger's policy version) nothing
    runs: the refusal goes into the decision audit trail (reason
    ``intent_mismatch``), a new request is recorded under the running
    ledger's policy, and the effect goes back to a person with the holder's
    fenced release (``status.HOLD``); returns it as it now waits. Read only
    for an effect someone decided (``decided_at``): a run nobody had to
    approve pays nothing.
    """
    why = await approved_intent_differs(store, claimed, prepared.hooks.approval_policy_version)
    if why is None:
        return None
    log_effect(logging.WARNING, f"approval refused at run: {why}", claimed)
    await refuse_changed_intent(store, claimed, why)
    await note_approval(store, claimed.idem_key, approval_ask(prepared), renew=True)
    if not await store.release(claimed.id, attempt=claimed.attempt, for_approval=True):
        raise EffectLedgerInvariantError(
            f"effect {claimed.idem_key} was taken from its holder between its claim and its release"
        )
    held = await store.get(claimed.id) or claimed
    await notify_approval_required(held, prepared.hooks)
    return held


async def park_if_unapproved(store: Store, prepared: Prepared, claimed: Effect) -> bool:
    """A call that needs approval runs only an effect a person decided.

    ``claimed`` is ours (a claim or a takeover of an effect this call did
    not create). When the call needs approval (``requires_approval=True``,
    or its policy says so: asked here, since the key was stored) and the
    effect carries no decision (``decided_at``: only a decision writes it,
    and under PostgreSQL's role set only an approver or a cancel), it is
    sent to a person (the holder's fenced ``release(for_approval=True)``)
    instead of run: a row someone wrote as processing, or as ready,
    without anyone approving it, never runs a gated call. True if parked
    (or the fenced release found it moved on: wait for it either way).
    """
    if claimed.decided_at is not None:
        return False
    needs = prepared.needs_approval
    if not needs and prepared.policy is not None:
        try:
            needs = prepared.policy()
        except BaseException:
            await store.release(claimed.id, attempt=claimed.attempt, for_approval=True)
            raise
    if not needs:
        return False
    # Carried through a cancellation: a claim no handler will use goes back.
    if await carry_through(store.release(claimed.id, attempt=claimed.attempt, for_approval=True)):
        approval_entered(claimed)
        log_effect(logging.WARNING, "undecided effect sent for approval, not run", claimed)
    return True


def approval_ask(prepared: Prepared) -> ApprovalAsk:
    """The approval request a prepared call makes (``RunOptions.principal``,
    ``approval_deadline_ms``; ``LedgerHooks.approval_policy_version``)."""
    return ApprovalAsk.of(prepared.opts, prepared.hooks)


def approval_in_transaction(new: NewEffect) -> EffectLedgerValidationError:
    """Why a call that needs approval cannot create its effect inside a transaction."""
    return EffectLedgerValidationError(
        f"{new.tool} needs approval, and an effect that needs approval cannot be "
        "created inside a transaction (nobody can approve it before the transaction "
        "commits). Call run() without tx=, or request the approval in its own step.",
        field="tx",
    )
