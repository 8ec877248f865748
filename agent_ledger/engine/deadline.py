"""A handler's deadline (``RunOptions(timeout_ms=...)``): run it, stop it, say how it ended.

What can be stopped is stopped at the deadline: an async handler (the
awaitable a handler returns) is cancelled where it awaits. What cannot is
waited for: a plain handler runs in a thread (or on the loop) and Python
cannot interrupt either, so its deadline breach is found when it returns.
Either way the run returns only once the handler has stopped, and the
heartbeats go on meanwhile (a handler that ignores its cancellation for a
while keeps the effect held until it ends, rather than leave it to a
takeover while it still runs).

A handler that ran past its deadline is never run again automatically,
whatever a retry policy says: a cancelled handler may or may not have done
its side effect, and a late one did it. How the breach is recorded
(:func:`late_outcome`) is the same for every store:

* cancelled at the deadline (it let the cancellation end it, or raised
  while ending): ``canceled``, code ``handler_timeout``;
* returned after the deadline (a plain handler, or an async one that
  swallowed its cancellation): ``failed``, code ``handler_timeout``, the
  late value kept as the effect's ``result`` for a person to see (a caller
  never gets it: it did not arrive in time);
* raised after the deadline, without being cancelled (a plain handler):
  ``failed``, code ``handler_timeout``, its own error in the message.

A cancellation of the caller itself always propagates (recorded by the
usual cancellation rules, code ``cancelled``), even while the deadline's
own cancellation is under way.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Final, NamedTuple

from agent_ledger.codes import ErrorCode
from agent_ledger.effects import EffectError
from agent_ledger.engine.limits import cap_message
from agent_ledger.errors import HANDLER_TIMEOUT, EffectLedgerValidationError
from agent_ledger.keys import canonical_json
from agent_ledger.status import EffectStatus

__all__ = ["HANDLER_TIMEOUT", "Late", "late_outcome", "within"]

#: Recorded for a handler cancelled at its deadline.
CANCELLED_AT_DEADLINE: Final = (
    "the handler ran past its deadline (timeout_ms={limit}) and was cancelled; it ended "
    "after {ran:.0f} ms{how}. Whether its side effect happened is unknown, so the effect "
    "is not retried automatically (reopen() it to run it again)"
)
#: Recorded for a handler that returned after its deadline.
RETURNED_LATE: Final = (
    "the handler returned after {ran:.0f} ms, past its deadline (timeout_ms={limit}){why}; "
    "its late result is kept on the receipt but was not returned to the caller, and the "
    "effect is not retried automatically"
)
#: Recorded for a handler that raised after its deadline.
RAISED_LATE: Final = (
    "the handler raised after {ran:.0f} ms, past its deadline (timeout_ms={limit}){why}: "
    "{error}; the effect is not retried automatically"
)
#: Why a handler could run past its deadline without being cancelled.
NOT_INTERRUPTIBLE: Final = " (a plain function cannot be interrupted)"
IGNORED_CANCEL: Final = " (it did not stop when cancelled)"


class Late(NamedTuple):
    """A handler that was still running at its deadline, and how it ended."""

    #: How long it ran, in ms (by the loop's clock).
    ran_ms: float
    #: True: it was cancelled at the deadline and ended by that (or by an
    #: error while ending); False: nothing could stop it and it ran to the end.
    cancelled: bool
    #: What it returned (when ``exc`` is None and it was not cancelled).
    value: object = None
    #: What it raised, when it raised anything but the cancellation.
    exc: BaseException | None = None
    #: It was cancelled, but swallowed the cancellation and returned.
    ignored_cancel: bool = False


async def within(limit_ms: int, start: Callable[[], Awaitable[object]]) -> object:
    """Run a handler with a deadline; its value, or a :class:`Late` if it ran past it.

    ``start`` runs what cannot be interrupted (the handler's call, in a
    thread or on the loop) and returns the handler's value; an awaitable
    value (an async handler's coroutine) is then awaited until the
    deadline, and cancelled there. An exception the handler raised before
    its deadline is raised as it is (a retry policy may retry it).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + limit_ms / 1000.0
    try:
        value = await start()
    except Exception as exc:
        if loop.time() > deadline:
            return Late((loop.time() - started) * 1000.0, cancelled=False, exc=exc)
        raise
    if not inspect.isawaitable(value):
        if loop.time() > deadline:
            return Late((loop.time() - started) * 1000.0, cancelled=False, value=value)
        return value
    scope = asyncio.timeout_at(deadline)
    try:
        async with scope:
            value = await value
    except TimeoutError as exc:
        if not scope.expired():
            raise  # the handler's own TimeoutError, before its deadline
        return Late((loop.time() - started) * 1000.0, cancelled=True, exc=_own(exc))
    except Exception as exc:
        if scope.expired():  # cancelled at the deadline, and raised while ending
            return Late((loop.time() - started) * 1000.0, cancelled=True, exc=exc)
        raise
    if scope.expired():  # it swallowed the cancellation and returned a value
        ran = (loop.time() - started) * 1000.0
        return Late(ran, cancelled=False, value=value, ignored_cancel=True)
    return value


def _own(exc: TimeoutError) -> BaseException | None:
    """The handler's own error behind the deadline's ``TimeoutError``; None if it just ended."""
    cause = exc.__cause__
    return None if cause is None or isinstance(cause, asyncio.CancelledError) else cause


def late_outcome(late: Late, limit_ms: int) -> tuple[EffectStatus, str | None, EffectError]:
    """How to record a handler that ran past its deadline: status, result JSON, error."""
    if late.cancelled:
        how = "" if late.exc is None else f", raising {_describe(late.exc)}"
        message = CANCELLED_AT_DEADLINE.format(limit=limit_ms, ran=late.ran_ms, how=how)
        return (
            EffectStatus.CANCELED,
            None,
            EffectError(cap_message(message), ErrorCode.HANDLER_TIMEOUT),
        )
    why = IGNORED_CANCEL if late.ignored_cancel else NOT_INTERRUPTIBLE
    if late.exc is not None:
        message = RAISED_LATE.format(
            limit=limit_ms, ran=late.ran_ms, why=why, error=_describe(late.exc)
        )
        return (
            EffectStatus.FAILED,
            None,
            EffectError(cap_message(message), ErrorCode.HANDLER_TIMEOUT),
        )
    message = RETURNED_LATE.format(limit=limit_ms, ran=late.ran_ms, why=why)
    try:
        result_json: str | None = canonical_json(
            late.value, field="result", sort_keys=False
        ).decode()
    except EffectLedgerValidationError as exc:
        result_json = None
        message += f" (the late result could not be kept: {exc})"
    return EffectStatus.FAILED, result_json, EffectError(message, ErrorCode.HANDLER_TIMEOUT)


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
