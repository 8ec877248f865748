"""Acquiring a prepared call's effect: insert it or find it, then own it or reach its outcome.

A caller whose ``begin`` created the effect owns it; any other waits
(``waiting``) until it may claim it or the effect ends. Inside a caller's
transaction nothing waits: an approved effect is claimed at once, anything
held elsewhere raises ``EffectInFlightError``. With ``legacy_keys=True`` a
call is first followed to the effect its 0.2.x key was imported as.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Final

import orjson

from agent_ledger.codes import ErrorCode
from agent_ledger.decisions import notify_approval_required
from agent_ledger.effects import Effect, EffectError, Parked
from agent_ledger.engine.ownership import own
from agent_ledger.engine.preparing import Prepared
from agent_ledger.engine.recording import Outcome, Recorder, lease_end
from agent_ledger.engine.waiting import Acquired, Waiter
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectDeniedError,
    EffectFailedError,
    EffectInFlightError,
    EffectLedgerInvariantError,
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    HandlerTimeoutError,
    is_handler_timeout,
)
from agent_ledger.keys import mismatched_args
from agent_ledger.legacy.keys import legacy_mismatched_args
from agent_ledger.observability import log_effect
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import BeginOutcome, ClaimOutcome, NewEffect, SchemaCheck, Store

__all__ = ["TOO_MANY_TAKEOVERS", "Acquirer", "recorded_outcome", "takeovers"]

#: Reason recorded when an effect was taken over more than ``max_takeovers`` times.
TOO_MANY_TAKEOVERS: Final = (
    "taken over {n} times (max_takeovers={limit}): each holder stopped heartbeating "
    "before it finished, so the handler may be blocking its event loop or outliving its "
    "lease; not run again automatically. Check whether the side effect happened."
)


class Acquirer:
    """Finds or creates effects for one ledger's engine, and waits for them."""

    def __init__(self, store: Store, schema: SchemaCheck, recorder: Recorder) -> None:
        self._store = store
        self._schema = schema
        self._recorder = recorder
        self._waiter = Waiter(store)

    async def acquire(self, prepared: Prepared, tx: object | None) -> Acquired:
        """Own a ``processing`` effect, or reach a terminal one, waiting as needed."""
        if not self._schema.ok:
            await self._schema.ensure(tx)
        unasked = prepared.policy
        if unasked is not None:
            prepared = await self._ask_policy_if_fresh(prepared, unasked, tx)
        new = prepared.new
        if tx is not None and prepared.needs_approval:
            await self._refuse_new_approval_in_transaction(new, tx)
        if tx is None:
            # Cancelled while the insert is in flight: wait for it, and give
            # back an effect it created for us to run (see ownership).
            begun = await own(self._store, self._store.begin(new), _created_to_run, name="begin")
        else:
            begun = await self._store.begin(
                new, tx=tx, lock_timeout_ms=prepared.opts.tx_lock_timeout_ms
            )
        effect = begun.effect
        if begun.created and prepared.policy is not None:
            # The key was stored when we looked, and is gone now (purged): this
            # call is fresh after all, and its policy was not asked yet.
            effect = await self._ask_policy_late(prepared, prepared.policy, effect, tx)
        if not begun.created and prepared.validate_keys is not None:
            # Before any waiting: a caller with other values must never get
            # (or wait for) the outcome of a request it did not make.
            differ = mismatched_args(
                effect.args_canonical, new.args_canonical, prepared.validate_keys
            )
            if differ:
                log_effect(logging.INFO, f"payload mismatch on {list(differ)}", effect)
                raise EffectPayloadMismatchError(effect, differ)
        if begun.created:
            if effect.status is not EffectStatus.REQUIRES_APPROVAL:
                log_effect(logging.DEBUG, "effect created", effect)
                return Acquired(effect, owned=True, fresh=True)
            # Inserted waiting for a person, in the same atomic step.
            log_effect(logging.INFO, "effect requires approval", effect)
            await notify_approval_required(effect, prepared.hooks)
        elif effect.status.is_terminal:
            if effect.retryable and tx is None:
                return await self.retry(prepared, effect)
            log_effect(logging.DEBUG, "effect replayed", effect)
            return Acquired(effect, owned=False)
        return await self.wait(prepared, effect, tx)

    async def retry(self, prepared: Prepared, failed: Effect) -> Acquired:
        """A later call after a failure its tool declared retryable: run it again.

        One fenced store step (``Store.retry_failed``, from ``failed`` at the
        attempt read to ``processing`` at the next), so of any number of
        callers that read this failure exactly one owns the new attempt; the
        others wait for its outcome, whatever it is (a new retryable failure
        included: it answers the calls it was running for). Cancelled while
        the step is in flight, an attempt it made ours is given back
        (``ownership.own``), so the next caller claims it at once.
        """
        store = self._store
        outcome = await own(
            store,
            store.retry_failed(
                failed.idem_key, attempt=failed.attempt, lease_ms=prepared.opts.stale_after_ms
            ),
            _retried_to_run,
            name="retry_failed",
        )
        if outcome.claimed and outcome.effect is not None:
            log_effect(
                logging.INFO,
                f"retrying after a retryable failure (attempt {outcome.effect.attempt})",
                outcome.effect,
            )
            return Acquired(outcome.effect, owned=True)
        # Someone else's retry won (or a person reopened it): read it as it
        # stands now, after their step, and wait for its outcome.
        current = await store.find(failed.idem_key)
        if current is None:
            return Acquired(failed, owned=False)
        if current.status.is_terminal:
            return Acquired(current, owned=False)
        return await self.wait(prepared, current, None)

    async def follow_legacy_key(self, prepared: Prepared, tx: object | None) -> Prepared:
        """``legacy_keys=True``: the call goes on under the key of the effect its
        0.2.x key was imported as, so it is answered (replayed, waited for,
        claimed) exactly as that effect's own calls are. Before ``acquire``,
        so that every later step of the run (waiting again after a lost
        commit included) uses that key.

        Not when nothing was imported under that key, or the effect found is
        another workflow's or tool's: 0.2.x's ``"|"`` join gave both the same
        key, and that receipt is not this call's.
        """
        new, legacy_key = prepared.new, prepared.legacy_key
        if legacy_key is None:
            return prepared
        if not self._schema.ok:
            await self._schema.ensure(tx)
        effect = await self._store.find_legacy(legacy_key, tx=tx)
        if (
            effect is None
            or effect.idem_key == new.idem_key
            or (effect.workflow_id, effect.tool) != (new.workflow_id, new.tool)
        ):
            return prepared
        if prepared.validate_keys is not None:
            # Compared as 0.2.x compared them: its records cannot tell 1 from 1.0.
            differ = legacy_mismatched_args(
                effect.args_canonical, new.args_canonical, prepared.validate_keys
            )
            if differ:
                log_effect(logging.INFO, f"payload mismatch on {list(differ)}", effect)
                raise EffectPayloadMismatchError(effect, differ)
        log_effect(logging.DEBUG, "answered by the effect imported under its 0.2.x key", effect)
        return prepared._replace(new=new._replace(idem_key=effect.idem_key), validate_keys=None)

    async def _ask_policy_if_fresh(
        self, prepared: Prepared, policy: Callable[[], bool], tx: object | None
    ) -> Prepared:
        """Ask the ``requires_approval`` policy hook if the key is not stored yet.

        Its answer only matters when ``begin`` creates the effect, and the
        docs promise it is asked for fresh calls only: a replay never asks it
        (one primary-key read, only for calls with a policy hook). Asked
        before ``begin``, so a policy that raises leaves nothing stored. Two
        first calls racing for one key may both ask it. The answer goes into
        the insert itself (``NewEffect.requires_approval``): one atomic step.
        A key found stored keeps ``policy`` set, for :meth:`_ask_policy_late`.
        """
        if await self._store.find(prepared.new.idem_key, tx=tx) is not None:
            return prepared
        needs = policy()
        return prepared._replace(
            new=prepared.new._replace(requires_approval=needs), needs_approval=needs, policy=None
        )

    async def _ask_policy_late(
        self, prepared: Prepared, policy: Callable[[], bool], effect: Effect, tx: object | None
    ) -> Effect:
        """Our begin created the effect, ``processing`` and ours, after the key had
        been seen stored (it was purged in between): ask the policy now. If it
        says yes, or raises, the effect goes to a person before anything runs
        (the holder's fenced ``release(..., for_approval=True)``), and the
        effect returned waits for approval. Inside a transaction nobody could
        approve it: refused as a fresh gated call is, and the caller's
        rollback removes the insert."""
        try:
            needs = policy()
        except BaseException:
            if tx is None:
                await self._store.release(effect.id, attempt=effect.attempt, for_approval=True)
            raise
        if not needs:
            return effect
        if tx is not None:
            raise _approval_in_transaction(prepared.new)
        await self._store.release(effect.id, attempt=effect.attempt, for_approval=True)
        held = await self._store.get(effect.id)
        return held if held is not None else effect

    async def _refuse_new_approval_in_transaction(self, new: NewEffect, tx: object) -> None:
        """An effect that needs approval cannot start inside a caller's transaction.

        Nobody outside can see it, so nobody can approve it, until the
        transaction commits; waiting for the approval inside it would wait
        for ever. An existing effect (a replay) is fine.
        """
        if await self._store.find(new.idem_key, tx=tx) is None:
            raise _approval_in_transaction(new)

    async def wait(self, prepared: Prepared, effect: Effect, tx: object | None) -> Acquired:
        """Wait for the effect; a claim past ``max_takeovers`` ends it as failed instead.

        Inside a caller's transaction there is no waiting: an approved
        effect is claimed at once, anything else held elsewhere raises
        ``EffectInFlightError`` (see there for why).
        """
        if tx is not None:
            return await self._claim_in_transaction(prepared, effect, tx)
        acquired = await self._waiter.wait(
            prepared.new.idem_key,
            effect,
            prepared.opts,
            tx,
            on_parked=functools.partial(notify_approval_required, hooks=prepared.hooks),
        )
        limit = prepared.opts.max_takeovers
        claimed = acquired.effect
        if not acquired.owned or limit is None or takeovers(claimed) <= limit:
            return acquired
        error = EffectError(
            message=TOO_MANY_TAKEOVERS.format(n=takeovers(claimed), limit=limit),
            code=ErrorCode.TOO_MANY_TAKEOVERS,
        )
        # Just claimed: the lease is whole.
        until = lease_end(asyncio.get_running_loop().time(), prepared.opts.stale_after_ms)
        # started=False: no handler runs for this claim, so it is no execution.
        failed = Outcome(EffectStatus.FAILED, error=error, ends_try=False, started=False)
        if await self._recorder.landed(claimed, failed, tx, until):
            log_effect(logging.WARNING, "effect failed: too many takeovers", claimed)
        stored = await self._store.get(claimed.id, tx=tx)
        if stored is None or not stored.status.is_terminal:
            # Someone decided meanwhile (a cancel): wait for where it ends.
            return await self.wait(prepared, stored or claimed, tx)
        return Acquired(stored, owned=False)

    async def _claim_in_transaction(
        self, prepared: Prepared, effect: Effect, tx: object
    ) -> Acquired:
        key = prepared.new.idem_key
        if effect.status is EffectStatus.READY:
            # stale_after_ms=0: an approved effect is claimed, a held one never;
            # should the caller leave it processing (begin() without commit()),
            # its own lease applies once the transaction commits.
            outcome = await self._store.claim(
                key,
                stale_after_ms=0,
                lease_ms=prepared.opts.stale_after_ms,
                tx=tx,
                lock_timeout_ms=prepared.opts.tx_lock_timeout_ms,
            )
            if outcome.effect is None:
                raise EffectLedgerInvariantError(f"effect {key} disappeared inside a transaction")
            effect = outcome.effect
            if outcome.claimed:
                log_effect(logging.INFO, f"claimed effect (attempt {effect.attempt})", effect)
                return Acquired(effect, owned=True)
        if effect.status.is_terminal:
            return Acquired(effect, owned=False)
        if effect.status is EffectStatus.REQUIRES_APPROVAL and not prepared.opts.wait_for_approval:
            raise ApprovalPendingError(effect)
        raise EffectInFlightError(key, effect.status)


def recorded_outcome(acquired: Acquired) -> object:
    """The outcome a caller gets for an effect someone else finished.

    A result that other waiters received too (a shared poll) is copied, so
    no caller can mutate another's.
    """
    effect = acquired.effect
    status = effect.status
    if status is EffectStatus.SUCCEEDED:
        result = effect.result
        if acquired.shared and isinstance(result, dict | list):
            return orjson.loads(orjson.dumps(result))
        return result
    if is_handler_timeout(effect):
        raise HandlerTimeoutError(effect)  # failed or canceled: the same error as the first call
    if status is EffectStatus.FAILED:
        raise EffectFailedError(effect)
    if status is EffectStatus.DENIED or status is EffectStatus.CANCELED:
        raise EffectDeniedError(effect)
    raise EffectLedgerInvariantError(f"no recorded outcome for a {status.value} effect")


def takeovers(effect: Effect) -> int:
    """How often ``effect`` was taken over from a holder that stopped heartbeating.

    Every execution but the first began with a takeover, or with a person's
    approval of a parked run: the only ways into ``processing`` are the
    insert, the claim of an approved effect (before any run, or after a
    park: the history counts those), a takeover, and the claim of a
    released effect (a release takes back the execution its own claim
    added, so the counts still hold).
    """
    parks = sum(1 for event in effect.history if isinstance(event, Parked))
    return max(effect.executions - 1 - parks, 0)


def _created_to_run(begun: BeginOutcome) -> Effect | None:
    """The effect a begin made ours: inserted as processing (not waiting for a person)."""
    effect = begun.effect
    return effect if begun.created and effect.status is EffectStatus.PROCESSING else None


def _retried_to_run(outcome: ClaimOutcome) -> Effect | None:
    """The effect a retry made ours: the new attempt it claimed."""
    return outcome.effect if outcome.claimed else None


def _approval_in_transaction(new: NewEffect) -> EffectLedgerValidationError:
    return EffectLedgerValidationError(
        f"{new.tool} needs approval, and an effect that needs approval cannot be "
        "created inside a transaction (nobody can approve it before the transaction "
        "commits). Call run() without tx=, or request the approval in its own step.",
        field="tx",
    )
