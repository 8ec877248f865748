"""Undoing a saga's steps: groups in reverse order, each group's steps at once.

Used by the worker whose saga failed and by ``recover_sagas()`` alike, and
built only from stored steps, the effects they name and the ledger's tool
registry, so a worker that never saw the saga's code can finish it.

Whether a step is undone depends on its forward effect, settled first:

* never began: it is closed (an effect with its key, ``canceled``), so an
  old owner that wakes up later cannot begin it; nothing to undo;
* waiting for a person (``requires_approval``, or approved and not yet
  claimed): canceled; a later ``approve()`` returns False; nothing to undo.
  The cancel is one compare-and-set from those two statuses: a step a
  worker claimed meanwhile is never canceled under its running handler;
* running: waited for; if its holder stops heartbeating for a whole lease,
  it is taken over (one fenced claim, so the old holder can no longer start
  its handler) and canceled, and counts as attempted, unless its handler
  started under ``on_stale="park"``: then it is parked for a person. A holder that
  disabled takeover (``StaleOptions(after_ms=0)``) can never be told dead:
  the undo stops with ``SagaStepUnsettled`` (the saga stays
  ``compensating``) rather than wait for ever;
* parked (an ambiguous attempt): waited for until a person settles it
  (resolved: undone like any success or failure; denied: nothing to undo;
  approved: canceled, as any approved step of a rolled-back saga);
* succeeded: undone; failed (or canceled after its handler started): undone
  only when its tool says ``compensate_if="attempted"``; denied: never ran.

Each undo is an ordinary effect keyed from the forward key, run by the path
every call of its tool takes (``Tool.run_as``), with the tool's retry policy
(by default :data:`COMPENSATION_RETRY`): two workers finishing one saga run it
once. In a recovery pass it never
waits for a person (parked mid-undo, or sent for approval by its tool): the
pass reports ``SagaStepParked`` for that saga and goes on with the others.
It runs out of any saga's
step context: tools its handler calls are ordinary effects. A store error
while undoing is not the compensation failing: it propagates, and the saga
stays ``compensating`` for a later pass (or re-run) to finish.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from agent_ledger.backoff import Backoff
from agent_ledger.calls import ToolCall
from agent_ledger.codes import ErrorCode
from agent_ledger.context import recording, set_step_runner, suspend_budgets, waits_for_parked
from agent_ledger.decisions import (
    WAITING_FOR_A_PERSON,
    cancel_if_waiting,
    close_unbegun,
    park_if_silent,
    take_over_and_cancel,
)
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectLedgerValidationError,
    EffectStoreError,
    EffectTimeoutError,
    HandlerTimeoutError,
)
from agent_ledger.options import UNSET, RunOptions, merge_run_options
from agent_ledger.retries import RetryPolicy
from agent_ledger.sagas._errors import SagaStepParked, SagaStepUnsettled
from agent_ledger.status import EffectStatus
from agent_ledger.stores.saga_base import SagaStep

if TYPE_CHECKING:
    from agent_ledger.tools import ToolLedger

#: A compensation tool registered without a retry policy gets this one: a few
#: tries with backoff, since an undo that gives up leaves money taken.
COMPENSATION_RETRY: Final = RetryPolicy(on=Exception, attempts=3, initial_ms=200, max_ms=2_000)
#: The argument a compensation's key is made of: the forward effect's key.
FORWARD_ARGUMENT: Final = "forward"
#: How often a settling step polls a forward effect someone else is running.
_POLL: Final = Backoff(initial_s=0.02, multiplier=2.0, max_s=0.5)
_S = EffectStatus


@dataclass(frozen=True, slots=True)
class Undo:
    """What compensating one step did."""

    step: SagaStep
    #: True: undone (now or before); False: its compensation failed; None: nothing to undo.
    undone: bool | None
    error: EffectError | None = None


def compensation_call(workflow_id: str, compensation: str, forward_key: str) -> ToolCall:
    """The call whose effect undoes the forward effect keyed ``forward_key``."""
    return ToolCall(
        workflow_id=workflow_id, tool=compensation, args={FORWARD_ARGUMENT: forward_key}
    )


async def cancel_for_rollback(ledger: ToolLedger, idem_key: str) -> bool:
    """Cancel a step's effect only while it waits for a person (see
    ``decisions.cancel_if_waiting``); True if this call canceled it."""
    error = EffectError("the saga was rolled back", ErrorCode.CANCELED)
    return await cancel_if_waiting(ledger.store, idem_key, error, by="saga")


def check_compensation_tool(ledger: ToolLedger, tool_name: str, name: str) -> None:
    """Raise unless ``name`` is a registered tool that can undo ``tool_name``'s calls."""
    tool = ledger.tools.get(name)
    if tool is None:
        raise EffectLedgerValidationError(
            f"tool {tool_name!r} is compensated by {name!r}, which is not registered on this "
            f"ledger: register it (@ledger.tool({name!r})) before running the saga. "
            "Nothing was run.",
            field="compensate",
        )
    params = [
        p
        for p in tool.signature.parameters.values()
        if p.name != "effect" or p.kind is not inspect.Parameter.KEYWORD_ONLY
    ]
    required = [p for p in params if p.default is inspect.Parameter.empty]
    if not params or len(required) > 1 or params[0].kind is inspect.Parameter.KEYWORD_ONLY:
        raise EffectLedgerValidationError(
            f"compensation tool {name!r} must take the forward effect as its one positional "
            f"parameter (`async def {name.rsplit('.', 1)[-1]}(forward: Effect)`); its "
            f"signature is {tool.signature}. Nothing was run.",
            field="compensate",
        )


async def compensate(
    ledger: ToolLedger,
    saga_id: str,
    steps: Iterable[SagaStep],
    *,
    stop_on_failure: bool,
) -> list[Undo]:
    """Undo ``steps``: groups in reverse order, each group's steps concurrently.

    With ``stop_on_failure``, no later group is started once a compensation
    in a group failed (the group itself finishes).
    """
    groups: dict[int, list[SagaStep]] = {}
    for step in steps:
        groups.setdefault(step.group_index, []).append(step)
    undone: list[Undo] = []
    for index in sorted(groups, reverse=True):
        # Every undo of the group ends before an error (a store error, say)
        # leaves: none is left running unawaited.
        results = await asyncio.gather(
            *(_undo(ledger, saga_id, s) for s in groups[index]), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        done = [r for r in results if isinstance(r, Undo)]
        undone.extend(done)
        if stop_on_failure and any(r.undone is False for r in done):
            break
    return undone


async def _undo(ledger: ToolLedger, saga_id: str, step: SagaStep) -> Undo:
    # Its own task (gather): the step runner is cleared in its copy of the
    # context only. A tool the compensation calls is an ordinary effect, not
    # a step of the saga being undone (whose block has ended).
    set_step_runner(None)
    # An undo, and every tool or model call it makes, is never refused for
    # lack of budget: the saga's budget stays in the context it inherited.
    suspend_budgets()
    forward = await settle(ledger, saga_id, step)
    if forward is None or step.compensation is None or not _due(step, forward):
        return Undo(step, None)
    tool = ledger.tools[step.compensation]
    options = None
    own, _ = tool.run_settings
    if own is None or own.retry is UNSET:
        options = RunOptions(retry=COMPENSATION_RETRY)
    if not waits_for_parked():
        # A recovery pass: an undo waiting for a person (parked, or sent to
        # one by its tool's approval policy) stops this saga, not the pass.
        options = merge_run_options(options or RunOptions(), RunOptions(wait_for_approval=False))
    call = compensation_call(forward.workflow_id, tool.name, forward.idem_key)
    # The function's one positional parameter gets the forward effect (see
    # check_compensation_tool), on every attempt of the undo.
    first = next(iter(tool.signature.parameters))
    try:
        await tool.run_as(call, {first: forward}, run_options=options)
    except EffectStoreError:
        raise  # the store failed, not the compensation: the saga stays compensating
    except HandlerTimeoutError as exc:
        # The undo's own handler ran out of time: a failed compensation.
        return Undo(step, False, EffectError(f"{type(exc).__name__}: {exc}", exc.code))
    except EffectTimeoutError:
        # Only the wait ran out (for the undo another worker holds): nothing
        # was decided, so the saga stays compensating and a later pass, or
        # the holder, finishes the undo (issue 26, item 2).
        raise
    except ApprovalPendingError as pending:
        raise SagaStepParked(saga_id, step, pending.effect) from None
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        return Undo(step, False, EffectError(message, getattr(exc, "code", None)))
    return Undo(step, True)


def _due(step: SagaStep, forward: Effect) -> bool:
    if forward.status is _S.SUCCEEDED:
        return True
    if step.compensate_if != "attempted":
        return False
    if forward.status is _S.FAILED:
        return True
    # Canceled: a cancel may have stopped a running handler; it counts as
    # attempted only if a handler was started.
    return forward.status is _S.CANCELED and forward.executions > 0


async def settle(ledger: ToolLedger, saga_id: str, step: SagaStep) -> Effect | None:
    """The step's forward effect once nothing can change it any more; None if it
    never began (and now never will).

    In a ``ledger.replay()`` block the forward effect is the recorded one:
    the step was answered from the recording, so the ledger's store has no
    receipt of it, and the undo is answered from the recording in turn.
    """
    answering = recording()
    if answering is not None and answering.ledger is ledger:
        recorded = await answering.recorded(step.idem_key)
        if recorded is not None:
            return recorded
    attempt = 0
    watched: tuple[object, float] | None = None
    while True:
        forward = await ledger.find_by_idem_key(step.idem_key)
        if forward is None:
            if await _close(ledger, saga_id, step):
                return None
            continue
        if forward.parked:
            # An ambiguous attempt: only a person can say whether it happened
            # (resolve: undo it; deny: nothing to undo; approve: it is canceled
            # below). The saga's own code waits for them, as its step's callers
            # do; a recovery pass does not (other sagas wait for it).
            if not waits_for_parked():
                raise SagaStepParked(saga_id, step)
            await asyncio.sleep(_POLL.delay(min(attempt, 10)))
            attempt += 1
            continue
        if forward.status in WAITING_FOR_A_PERSON:
            if await cancel_for_rollback(ledger, step.idem_key):
                return None
            continue  # claimed meanwhile: now running, waited for below
        if forward.status is not _S.PROCESSING:
            return forward
        # Running: wait for it. A holder that shows no heartbeat for a whole
        # lease (measured here, so no two clocks are compared) is gone.
        if forward.lease_ms <= 0:
            raise SagaStepUnsettled(saga_id, step)
        beat = (forward.attempt, forward.heartbeat_at)
        now = time.monotonic()
        if watched is None or watched[0] != beat:
            watched = (beat, now)
        elif now - watched[1] > forward.lease_ms / 1000:
            if forward.park_attempt == forward.attempt:
                # Its handler started under on_stale="park": park it for a
                # person (judged by the store's clock) rather than cancel it.
                moved = await park_if_silent(ledger.store, step.idem_key)
            else:
                error = EffectError(
                    "its worker stopped; the saga was rolled back", ErrorCode.CANCELED
                )
                moved = await take_over_and_cancel(
                    ledger.store, step.idem_key, forward.lease_ms, error
                )
            if moved.claimed:
                continue
            # The store's clock does not see it stale yet, or it changed: look
            # again after a pause (never a busy loop against a store that refuses).
        await asyncio.sleep(_POLL.delay(min(attempt, 10)))
        attempt += 1


async def _close(ledger: ToolLedger, saga_id: str, step: SagaStep) -> bool:
    """Close a step that never began (``decisions.close_unbegun``); True if this
    call closed it (False: its effect appeared meanwhile)."""
    error = EffectError(
        "the saga was rolled back before this step began", ErrorCode.SAGA_ROLLED_BACK
    )
    return await close_unbegun(
        ledger.store, step.idem_key, workflow_id=saga_id, tool=step.tool, error=error
    )
