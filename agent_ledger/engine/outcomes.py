"""What a recorded effect tells a caller: its outcome, and how often it was taken over.

Pure functions of an ``Effect`` (no store, no waiting), shared by acquiring
(the ``max_takeovers`` check) and the lifecycle and core (answering a call
from a receipt).
"""

from __future__ import annotations

from typing import Final

import orjson

from agent_ledger.effects import Effect, Parked, Reopening, RetryableFailure
from agent_ledger.engine.waiting import Acquired
from agent_ledger.errors import (
    EffectDeniedError,
    EffectFailedError,
    EffectLedgerInvariantError,
    HandlerTimeoutError,
    is_handler_timeout,
)
from agent_ledger.status import EffectStatus

__all__ = ["TOO_MANY_TAKEOVERS", "recorded_outcome", "takeovers"]

#: Reason recorded when an effect was taken over more than ``max_takeovers`` times.
TOO_MANY_TAKEOVERS: Final = (
    "taken over {n} times (max_takeovers={limit}): each holder stopped heartbeating "
    "before it finished, so the handler may be blocking its event loop or outliving its "
    "lease; not run again automatically. Check whether the side effect happened."
)


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

    Every execution but the first began with a takeover, with a person's
    approval of a parked run or a person's reopen, or with a later call's
    retry after a retryable failure: the only ways into ``processing`` are
    the insert, the claim of an approved effect (before any run, or after a
    park or a reopen: the history counts those), a takeover, the retry of a
    failed attempt (its ``RetryableFailure`` is in the history, at an
    earlier attempt), and the claim of a released effect (a release takes
    back the execution its own claim added, so the counts still hold).
    """
    # A park and a reopen each send the effect back to a person's ``ready``,
    # and the claim after it adds an execution that took nothing over. (A
    # reopen of an effect that had never started, canceled while it waited
    # for approval, is subtracted as well: one later takeover may then go
    # uncounted. The history does not say whether that run had started.)
    others = sum(
        1
        for event in effect.history
        if isinstance(event, Parked | Reopening)
        or (isinstance(event, RetryableFailure) and event.attempt < effect.attempt)
    )
    return max(effect.executions - 1 - others, 0)
