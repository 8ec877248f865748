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
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agent_ledger.backoff import LOCK_WAIT_SLICE_MS
from agent_ledger.codes import ErrorCode
from agent_ledger.deciding import approved_intent_differs
from agent_ledger.decisions import note_approval, notify_approval_required
from agent_ledger.effects import Effect, EffectError
from agent_ledger.engine import approving
from agent_ledger.engine.cancellation import carry_through
from agent_ledger.engine.leases import lease_end
from agent_ledger.engine.outcomes import TOO_MANY_TAKEOVERS, takeovers
from agent_ledger.engine.ownership import Pending, finish, own, start
from agent_ledger.engine.preparing import Prepared
from agent_ledger.engine.recording import Outcome, Recorder
from agent_ledger.engine.waiting import Acquired, Waiter
from agent_ledger.errors import (
    ApprovalIntentChangedError,
    ApprovalPendingError,
    EffectInFlightError,
    EffectLedgerInvariantError,
    EffectPayloadMismatchError,
    EffectTimeoutError,
)
from agent_ledger.keys import mismatched_args
from agent_ledger.metrics import approval_entered, replayed
from agent_ledger.observability import log_effect
from agent_ledger.status import TERMINAL, EffectStatus
from agent_ledger.stores.base import BeginOutcome, ClaimOutcome, NewEffect, SchemaCheck, Store

__all__ = ["Acquirer"]

T = TypeVar("T")


class Acquirer:
    """Finds or creates effects for one ledger's engine, and waits for them."""

    def __init__(self, store: Store, schema: SchemaCheck, recorder: Recorder) -> None:
        self._store = store
        self._schema = schema
        self._recorder = recorder
        self._waiter = Waiter(store)

    async def acquire(
        self, prepared: Prepared, tx: object | None, loop: asyncio.AbstractEventLoop | None = None
    ) -> Acquired:
        """Own a ``processing`` effect, or reach a terminal one, waiting as needed.

        Outside a transaction, ``wait_timeout_ms`` counts from here: time spent
        waiting for another transaction before the effect was found counts too.
        ``loop``: the running loop, when the caller has it at hand."""
        called = (loop or asyncio.get_running_loop()).time()
        if not self._schema.ok:
            await self._before_begin(self._schema.ensure(tx), prepared, tx, called)
        unasked = prepared.policy
        if unasked is not None:
            prepared = await self._before_begin(
                self._ask_policy_if_fresh(prepared, unasked, tx), prepared, tx, called
            )
        new = prepared.new
        if tx is not None and prepared.needs_approval:
            await self._refuse_new_approval_in_transaction(new, tx)
        since: float | None = None
        if tx is None:
            # Cancelled while the insert is in flight: wait for it, and give
            # back an effect it created for us to run (see ownership).
            store = self._store
            try:
                # own(), in two halves: a begin that ends without waiting costs no frame.
                begun = start(store.begin(new, lock_timeout_ms=LOCK_WAIT_SLICE_MS))
                if isinstance(begun, Pending):
                    begun = await finish(store, begun, _created_to_run, name="begin")
            except EffectInFlightError as exc:
                if exc.status is not None:
                    raise
                begun = await self._begin(new, called, prepared.opts.concurrency.wait_timeout_ms)
            since = called
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
                return Acquired(effect, True, True)  # owned, fresh
            # Inserted waiting for a person, in the same atomic step. Its request
            # (who asked, policy version, deadline) is recorded by us, its creator,
            # once; a renewal, since a purge leaves an older effect's request.
            approval_entered(effect)
            log_effect(logging.INFO, "effect requires approval", effect)
            # Carried through: a caller cancelled here still leaves the request
            # (and its deadline) recorded; only a process dying in between leaves none.
            await carry_through(
                note_approval(
                    self._store, effect.idem_key, approving.approval_ask(prepared), renew=True
                )
            )
            await notify_approval_required(effect, prepared.hooks)
            return await self.wait(prepared, effect, tx, since=since)
        if effect.status in TERMINAL:
            if effect.retryable and tx is None:
                acquired = await self.retry(prepared, effect)
            else:
                log_effect(logging.DEBUG, "effect replayed", effect)
                acquired = Acquired(effect, False)
        else:
            acquired = await self.wait(prepared, effect, tx, since=since)
        if not acquired.owned:
            replayed(effect.tool)  # the key was stored: another call's outcome answers
        return acquired

    @staticmethod
    async def _before_begin(
        reading: Coroutine[Any, Any, T], prepared: Prepared, tx: object | None, called: float
    ) -> T:
        """A read before the begin (the schema check, the approval policy's lookup),
        within the caller's ``wait_timeout_ms`` outside a transaction: on the
        embedded stores it waits for the store's open ``transaction()`` like any
        step. Abandoning a read changes nothing."""
        if tx is not None:
            return await reading
        limit_ms = prepared.opts.concurrency.wait_timeout_ms
        loop = asyncio.get_running_loop()
        try:
            # At least a slice, as a begin gets (wait_timeout_ms=0 included).
            async with asyncio.timeout_at(called + max(limit_ms, LOCK_WAIT_SLICE_MS) / 1000.0):
                return await reading
        except TimeoutError:
            waited_ms = (loop.time() - called) * 1000.0
            raise EffectTimeoutError(prepared.new.idem_key, None, waited_ms, limit_ms) from None

    async def _begin(self, new: NewEffect, began: float, limit_ms: int) -> BeginOutcome:
        """``begin`` outside any transaction, again, for a call made at ``began`` (the
        loop's clock) whose first try waited out its slice.

        Another transaction may hold the key (its insert of it, uncommitted;
        on SQLite the write lock): each try waits for it at most a slice
        (``backoff.LOCK_WAIT_SLICE_MS``), so the caller gets
        ``EffectTimeoutError`` (``status=None``) within a slice of its
        ``wait_timeout_ms``, and a cancellation lands within a slice. A try
        that ran out changed nothing. Cancelled while a try is in flight: wait
        for it, and give back an effect it created for us to run (see
        ownership).
        """
        store = self._store
        loop = asyncio.get_running_loop()
        tried = began
        while True:
            now = loop.time()
            waited_ms = (now - began) * 1000.0
            if waited_ms >= limit_ms:
                raise EffectTimeoutError(new.idem_key, None, waited_ms, limit_ms) from None
            # A store that answered before the bound (a lock it does not wait
            # for, such as MariaDB's below one second): wait out the slice.
            await asyncio.sleep(max(0.0, tried + LOCK_WAIT_SLICE_MS / 1000.0 - now))
            tried = loop.time()
            bound = LOCK_WAIT_SLICE_MS
            try:
                begun = await own(
                    store, store.begin(new, lock_timeout_ms=bound), _created_to_run, name="begin"
                )
            except EffectInFlightError as exc:
                if exc.status is not None:
                    raise
            else:
                return begun

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
            if await approving.park_if_unapproved(self._store, prepared, outcome.effect):
                return await self._wait_again(prepared, outcome.effect)
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
            if tx is None and await self._store.release(
                effect.id, attempt=effect.attempt, for_approval=True
            ):
                approval_entered(effect)
            raise
        if not needs:
            return effect
        if tx is not None:
            raise approving.approval_in_transaction(prepared.new)
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
            raise approving.approval_in_transaction(new)

    async def wait(
        self, prepared: Prepared, effect: Effect, tx: object | None, *, since: float | None = None
    ) -> Acquired:
        """Wait for the effect; a claim past ``max_takeovers`` ends it as failed instead.

        ``since``: when the caller began waiting, if before now (see ``WaitBudget``).

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
            since=since,
        )
        if acquired.owned and await approving.park_if_unapproved(
            self._store, prepared, acquired.effect
        ):
            return await self._wait_again(prepared, acquired.effect)
        if acquired.owned and acquired.effect.decided_at is not None:
            claimed = acquired.effect
            try:
                recheck = await carry_through(
                    approving.approval_still_holds(self._store, prepared, claimed)
                )
            except BaseException:
                # Cancelled (or failed) holding a claim no handler will use: give
                # it back (fenced: a no-op once it went back to a person).
                await carry_through(self._store.release(claimed.id, attempt=claimed.attempt))
                raise
            if recheck is not None:
                return await self.wait(prepared, recheck, tx)
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

    async def _wait_again(self, prepared: Prepared, parked: Effect) -> Acquired:
        """Wait for an effect this call just sent for approval, as it stands now."""
        current = await self._store.get(parked.id)
        if current is None or current.status.is_terminal:
            return Acquired(current or parked, owned=False)
        return await self.wait(prepared, current, None)

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
                why = await approved_intent_differs(
                    self._store, effect, prepared.hooks.approval_policy_version, tx
                )
                if why is not None:
                    # Nothing can be given back inside the caller's transaction: its
                    # rollback undoes the claim; a call outside one re-requests.
                    raise ApprovalIntentChangedError(effect, why)
                return Acquired(effect, owned=True)
        if effect.status.is_terminal:
            return Acquired(effect, owned=False)
        if effect.status is EffectStatus.REQUIRES_APPROVAL and not prepared.opts.wait_for_approval:
            raise ApprovalPendingError(effect)
        raise EffectInFlightError(key, effect.status)


def _created_to_run(begun: BeginOutcome) -> Effect | None:
    """The effect a begin made ours: inserted as processing (not waiting for a person)."""
    effect = begun.effect
    return effect if begun.created and effect.status is EffectStatus.PROCESSING else None


def _retried_to_run(outcome: ClaimOutcome) -> Effect | None:
    """The effect a retry made ours: the new attempt it claimed."""
    return outcome.effect if outcome.claimed else None
