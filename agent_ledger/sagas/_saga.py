"""``async with ledger.saga(id) as saga:``: tool calls inside are the saga's steps.

The saga owns a row in the store with a fenced owner. Each tool call inside
the block is given a position (the order the code reaches it), recorded
(only by the current owner) before its forward effect begins, and then run
through ``ledger.run()`` like any tool call. If a step fails, or the task is
cancelled, the block's exit undoes every completed step (see
``_compensation``) before the error leaves it.

Re-running the block under the same id replays: each position must ask for
the step recorded there, whose effect answers from its receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import socket
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from agent_ledger.calls import ToolCall
from agent_ledger.codes import ErrorCode
from agent_ledger.context import (
    reserve_step,
    reserved_step,
    set_step_runner,
    take_reserved_step,
)
from agent_ledger.effects import Effect, EffectError
from agent_ledger.engine.cancellation import carry_through, until_done
from agent_ledger.engine.heartbeats import Beat, Heartbeats
from agent_ledger.errors import (
    EffectFailedError,
    EffectLedgerValidationError,
    UnrecordedEffectError,
)
from agent_ledger.names import MAX_NAME_LENGTH, check_name_length
from agent_ledger.options import DEFAULT_STALE_AFTER_MS, MAX_LEASE_MS, LedgerHooks, RunOptions
from agent_ledger.sagas._compensation import (
    cancel_for_rollback,
    check_compensation_tool,
    compensate,
    compensation_call,
)
from agent_ledger.sagas._errors import (
    SagaCompensationFailed,
    SagaError,
    SagaFailed,
    SagaInFlightError,
    SagaNondeterminismError,
    SagaOwnershipLostError,
    SagaStepCancelled,
)
from agent_ledger.sagas._outcome import SagaOutcome, read_outcome
from agent_ledger.status import EffectStatus
from agent_ledger.stores.saga_base import (
    ON_COMPENSATION_FAILURE,
    NewSaga,
    NewSagaStep,
    SagaRecord,
    SagaStatus,
    SagaStep,
    SagaStore,
)
from agent_ledger.tools import Tool
from agent_ledger.tools._budget import BudgetScope
from agent_ledger.tools._workflow import WorkflowScope

if TYPE_CHECKING:
    from agent_ledger.budgets import Budget
    from agent_ledger.tools import ToolLedger

__all__ = ["Saga", "default_owner", "finish_compensation", "keep_alive", "saga_store"]

_G = SagaStatus
_WAITING: Final = frozenset({EffectStatus.REQUIRES_APPROVAL, EffectStatus.READY})
#: The error a saga records when the task running it was cancelled; the saga
#: then ends ``canceled``. Recognised by the whole error, never by its code
#: alone: a step's own error may carry the code ``"canceled"`` (a provider
#: saying an order was canceled), and its message always starts with the
#: exception's class name and a colon, which this one has not.
TASK_CANCELED: Final = EffectError("the task running the saga was cancelled", ErrorCode.CANCELED)
#: The longest saga id (in characters). A saga id is a primary key and every
#: step's workflow id, indexed by every store: 500 characters of at most 4
#: bytes each stay under PostgreSQL's B-tree entry limit (about 2,700 bytes).
MAX_SAGA_ID_LENGTH: Final = MAX_NAME_LENGTH


def default_owner() -> str:
    """Who holds a saga, for people: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def saga_store(ledger: ToolLedger) -> SagaStore:
    store = ledger.store
    if not isinstance(store, SagaStore):
        raise EffectLedgerValidationError(
            f"{type(store).__name__} does not keep sagas (it does not implement "
            "agent_ledger.stores.saga_base.SagaStore); use MemoryStore, SqliteStore or "
            "PostgresStore",
            field="store",
        )
    return store


def lease_of(lease_ms: int | None) -> int:
    if lease_ms is None:
        return DEFAULT_STALE_AFTER_MS
    if (
        isinstance(lease_ms, bool)
        or not isinstance(lease_ms, int)
        or not 100 <= lease_ms <= MAX_LEASE_MS
    ):
        raise EffectLedgerValidationError(
            f"lease_ms must be an int from 100 to {MAX_LEASE_MS} (ms), got {lease_ms!r}",
            field="lease_ms",
        )
    return lease_ms


def owner_of(owner: str | None) -> str:
    """Who holds a saga, checked: a person reads it in ``sagas list``."""
    if owner is None:
        return default_owner()
    if not isinstance(owner, str) or not owner.strip() or "\x00" in owner:
        raise EffectLedgerValidationError(
            f"owner must be a non-empty string without NUL (who runs the saga, for people), "
            f"got {owner!r}",
            field="owner",
        )
    check_name_length(owner, "owner")
    return owner


def check_saga_id(saga_id: str) -> None:
    if isinstance(saga_id, str) and len(saga_id) > MAX_SAGA_ID_LENGTH:
        raise EffectLedgerValidationError(
            f"a saga id is at most {MAX_SAGA_ID_LENGTH} characters, got one of "
            f"{len(saga_id)}; use a shorter id (a hash of a long one, say)",
            field="saga_id",
        )


def _abandon_ms(abandon_after: timedelta | None) -> int | None:
    if abandon_after is None:
        return None
    if not isinstance(abandon_after, timedelta) or abandon_after < timedelta(0):
        raise EffectLedgerValidationError(
            f"abandon_after must be a non-negative timedelta or None, got {abandon_after!r}",
            field="abandon_after",
        )
    return int(abandon_after / timedelta(milliseconds=1))


def keep_alive(ledger: ToolLedger, store: SagaStore, saga: SagaRecord) -> Beat:
    """Keep the owner of ``saga`` (held at ``saga.attempt``) alive with the engine's
    heartbeats: one every third of its lease, until the returned beat is
    stopped. Its ``lost`` turns True when a heartbeat finds the saga no longer
    ours (taken over, or finished): the owner must stop."""
    renew = functools.partial(store.heartbeat_saga, saga.saga_id, attempt=saga.attempt)
    return Heartbeats(ledger.store).keep(renew, saga.lease_ms, what=f"saga {saga.saga_id!r}")


@contextlib.contextmanager
def kept_alive(ledger: ToolLedger, store: SagaStore, saga: SagaRecord) -> Iterator[Beat]:
    """``keep_alive`` for the length of a block."""
    beat = keep_alive(ledger, store, saga)
    try:
        yield beat
    finally:
        beat.stop()


async def finish_compensation(
    ledger: ToolLedger, store: SagaStore, saga: SagaRecord
) -> SagaOutcome:
    """Undo the steps of ``saga`` (compensating, owned at ``saga.attempt``) and record
    how it ended; the outcome as stored."""
    steps = await store.saga_steps(saga.saga_id)
    for step in steps:
        if step.compensation is not None:
            check_compensation_tool(ledger, step.tool, step.compensation)
    undone = await compensate(
        ledger,
        saga.saga_id,
        steps,
        stop_on_failure=saga.on_compensation_failure == "stop",
    )
    if any(u.undone is False for u in undone):
        final = _G.COMPENSATION_FAILED
    elif saga.error == TASK_CANCELED:
        final = _G.CANCELED
    else:
        final = _G.COMPENSATED
    moved = await store.finish_saga(
        saga.saga_id, attempt=saga.attempt, expect=_G.COMPENSATING, then=final, error=None
    )
    if not moved:
        raise SagaOwnershipLostError(saga.saga_id)
    stored = await store.get_saga(saga.saga_id)
    assert stored is not None
    return await read_outcome(ledger, store, stored)


def rolled_back(outcome: SagaOutcome) -> SagaFailed:
    """The error for a saga that ended rolled back."""
    if outcome.status is _G.COMPENSATION_FAILED:
        failed = ", ".join(f"{s.position} ({s.tool})" for s in outcome.failed_compensations)
        which = (
            f"the compensation of step(s) {failed} kept failing"
            if failed
            else "a compensation did not succeed (`agent-ledger sagas show` draws each step)"
        )
        return SagaCompensationFailed(
            outcome,
            f"saga {outcome.saga_id!r} could not be undone: {which}. It is listed by "
            "`agent-ledger sagas list --status compensation_failed` for a person to finish.",
        )
    return SagaFailed(outcome)


class Saga:
    """One run of a saga's code; see the module doc and ``docs/sagas.md``."""

    def __init__(
        self,
        ledger: ToolLedger,
        saga_id: str,
        *,
        lease_ms: int | None = None,
        abandon_after: timedelta | None = None,
        on_compensation_failure: Literal["continue", "stop"] = "continue",
        owner: str | None = None,
        budget: Budget | None = None,
    ) -> None:
        check_saga_id(saga_id)  # first: a long id is refused as the saga's, not a workflow's
        self._scope = WorkflowScope(saga_id)  # the checks any workflow id gets
        # Its steps (tool calls) and model calls reserve on it (the one stored
        # under the saga id when none is given); the compensations never do.
        self._scope.budget = (
            BudgetScope.stored(ledger, saga_id)
            if budget is None
            else BudgetScope(ledger, saga_id, budget)
        )
        if on_compensation_failure not in ON_COMPENSATION_FAILURE:
            raise EffectLedgerValidationError(
                "on_compensation_failure must be 'continue' (try every other compensation) or "
                f"'stop', got {on_compensation_failure!r}",
                field="on_compensation_failure",
            )
        self.ledger = ledger
        self.saga_id = saga_id
        self._store = saga_store(ledger)
        self._new = NewSaga(
            saga_id,
            owner_of(owner),
            lease_of(lease_ms),
            _abandon_ms(abandon_after),
            on_compensation_failure,
        )
        self.attempt = 0
        #: Steps that failed with failure_scope="step": (position, the error).
        self.step_failures: list[tuple[int, BaseException]] = []
        #: Each step's exception whose effect ended failed, with the error its
        #: effect holds: a rollback it causes records that error (see _reason).
        self._failed_steps: list[tuple[BaseException, EffectError]] = []
        self._recorded: dict[int, SagaStep] = {}
        self._replay_only = False
        self._next_position = 0
        self._next_group = 0
        self._group: int | None = None
        self._tasks: list[tuple[asyncio.Task[Any], int]] = []
        self._keys: dict[int, str] = {}
        self._heartbeat: Beat | None = None
        self._tokens: list[contextvars.Token[Any]] = []
        self._entered = False
        self._closed = False
        #: The first nondeterminism found: (position, what was recorded, what was asked).
        #: Once set, no new step of this run may begin (see ``_check_position``).
        self._diverged: tuple[int, str, str] | None = None

    # -- entering ------------------------------------------------------------------

    async def __aenter__(self) -> Saga:
        if self._entered:
            raise SagaError(f"saga {self.saga_id!r}: this Saga object was already entered")
        self._entered = True
        if self._scope.budget is not None:
            # Before the saga row: a budget that does not match stores nothing.
            await self._scope.budget.open()
        # The store calls run to their end even if this task is cancelled
        # meanwhile (as the engine's own() does for an effect): a saga row
        # they created or claimed is ours then, and is rolled back (ending
        # `canceled`) rather than left running with no owner or heartbeat.
        entering = asyncio.ensure_future(self._begin())
        interrupted = await until_done(entering)
        if interrupted is not None:
            if entering.exception() is None and not self._replay_only:
                await carry_through(self._cancelled_at_entry(entering.result()))
            raise interrupted
        saga = entering.result()
        if not self._replay_only:
            self._heartbeat = keep_alive(self.ledger, self._store, saga)
        self._scope.__enter__()
        self._tokens.append(set_step_runner(self))
        return self

    async def _begin(self) -> SagaRecord:
        """Create the saga, or take the stored one (see ``_take``); now ours."""
        began = await self._store.begin_saga(self._new)
        saga = began.saga
        if not began.created:
            saga = await self._take(saga)
        self.attempt = saga.attempt
        if saga.status is _G.COMPLETED:
            self._replay_only = True
        if not began.created:
            self._recorded = {s.position: s for s in await self._store.saga_steps(self.saga_id)}
        return saga

    async def _cancelled_at_entry(self, saga: SagaRecord) -> None:
        """The entry was cancelled after ``saga`` became ours: roll it back as a
        cancelled block is (its recorded steps undone, then ``canceled``)."""
        with kept_alive(self.ledger, self._store, saga):
            await self._roll_back(TASK_CANCELED)

    async def _take(self, saga: SagaRecord) -> SagaRecord:
        """An existing saga: replay it, continue it, finish it or refuse, by its status."""
        if saga.status is _G.COMPLETED:
            return saga
        if saga.status.is_terminal:
            raise rolled_back(await read_outcome(self.ledger, self._store, saga))
        claimed = await self._store.claim_saga(
            self.saga_id,
            expect=saga.status,
            then=saga.status,
            lease_ms=self._new.lease_ms,
            idle_ms=0,
            owner=self._new.owner,
        )
        if claimed is None:
            now = await self._store.get_saga(self.saga_id)
            assert now is not None
            if now.status.is_terminal or now.status is not saga.status:
                return await self._take(now)
            raise SagaInFlightError(self.saga_id, now.owner, now.status.value)
        if claimed.status is _G.COMPENSATING:
            # Its owner died while undoing it: finish the undo, then report it.
            with kept_alive(self.ledger, self._store, claimed):
                outcome = await finish_compensation(self.ledger, self._store, claimed)
            raise rolled_back(outcome)
        return claimed

    # -- steps ---------------------------------------------------------------------

    def _place(self) -> tuple[int, int]:
        position = self._next_position
        self._next_position += 1
        if self._group is not None:
            return position, self._group
        group = self._next_group
        self._next_group += 1
        return position, group

    async def run_step(
        self,
        tool: Tool[object],
        call: ToolCall,
        handler: Callable[[Effect], object],
        run_options: RunOptions | None,
        hooks: LedgerHooks | None,
    ) -> object:
        """A tool call inside the block: record it at its position, then run it."""
        self._check_workflow(tool, call)
        reserved = reserved_step()
        if reserved is not None and reserved[0] is self:
            take_reserved_step()  # this task's own context: one call per start()
            position, group = reserved[1], reserved[2]
        else:
            if self._closed:
                raise SagaError(
                    f"saga {self.saga_id!r}: a tool was called after the saga's block ended"
                )
            position, group = self._place()
        if self._heartbeat is not None and self._heartbeat.lost:
            raise SagaOwnershipLostError(self.saga_id)
        key = self.ledger.idem_key(call)
        compensation_key = None
        if tool.compensate is not None:
            check_compensation_tool(self.ledger, tool.name, tool.compensate)
            undo = compensation_call(call.workflow_id, tool.compensate, key)
            compensation_key = self.ledger.idem_key(undo)
        await self._record(position, group, tool, key, compensation_key)
        self._keys[position] = key
        # A tool its handler calls is an ordinary effect, not a step: a replay
        # answers this step from its receipt without running the handler, so
        # such a call would not be made again and the positions would shift.
        token = set_step_runner(None)
        try:
            return await self.ledger.run(call, handler, run_options, hooks=hooks)
        except UnrecordedEffectError:
            raise  # a replay that diverged: never a step's own failure (see _exit)
        except Exception as exc:
            await self._note_failed_step(exc, key)
            if tool.failure_scope != "step":
                raise
            self.step_failures.append((position, exc))
            return None
        finally:
            token.var.reset(token)

    async def _note_failed_step(self, exc: Exception, key: str) -> None:
        """Remember the error the step's effect recorded, if it ended failed.

        A run raises the handler's own exception; a re-run or a replay raises
        ``EffectFailedError`` holding the recorded error. The saga's error is
        the recorded one either way, so a replay ends with the error the
        recorded run ended with (its export has no saga rows to read it from).
        """
        recorded: Effect | None
        if isinstance(exc, EffectFailedError):
            recorded = exc.effect
        else:
            try:
                recorded = await self.ledger.find_by_idem_key(key)
            except Exception:
                return  # the rollback falls back to the exception itself
        if recorded is not None and recorded.status is EffectStatus.FAILED and recorded.error:
            self._failed_steps.append((exc, recorded.error))

    def _check_workflow(self, tool: Tool[object], call: ToolCall) -> None:
        """Refuse a compensable step keyed under another workflow than the saga.

        Its effect would be shared with every other caller of that workflow
        (another saga making the same call replays it), and a saga undoes
        only effects keyed under its own id, never another saga's."""
        if tool.compensate is None or call.workflow_id == self.saga_id:
            return
        raise EffectLedgerValidationError(
            f"saga {self.saga_id!r}: tool {tool.name!r} (compensated by {tool.compensate!r}) "
            f"is called under workflow {call.workflow_id!r}, pinned by "
            "@ledger.tool(workflow_id=...) or a ledger.workflow() block inside the saga. Its "
            "effect would be shared with every other caller of that workflow, and a saga only "
            "undoes effects keyed under its own id: register a tool without workflow_id for "
            "sagas. Nothing was run.",
            field="workflow_id",
        )

    def _check_position(self, position: int, tool: str, key: str) -> SagaStep | None:
        """Raise ``SagaNondeterminismError`` if ``tool``/``key`` is not what was
        recorded at ``position``, or if any step of this run already diverged:
        after a divergence no new step begins, so a parallel group's sibling of
        the diverging step never runs. Synchronous, so ``start()`` checks a
        position before the step's task exists. The recorded step, if any."""
        if self._diverged is not None:
            raise SagaNondeterminismError(self.saga_id, *self._diverged)
        recorded = self._recorded.get(position)
        asked = f"tool {tool!r} (key {key[:12]}…)"
        was = None
        if recorded is None and self._replay_only:
            was = f"nothing (the saga completed with {len(self._recorded)} steps)"
        elif recorded is not None and (recorded.tool, recorded.idem_key) != (tool, key):
            was = f"tool {recorded.tool!r} (key {recorded.idem_key[:12]}…)"
        if was is not None:
            self._diverged = (position, was, asked)
            raise SagaNondeterminismError(self.saga_id, position, was, asked)
        return recorded

    async def _record(
        self, position: int, group: int, tool: Tool[object], key: str, undo_key: str | None
    ) -> None:
        recorded = self._check_position(position, tool.name, key)
        if recorded is None:
            step = NewSagaStep(
                position, group, tool.name, key, tool.compensate, undo_key, tool.compensate_if
            )
            stored = await self._store.record_step(self.saga_id, attempt=self.attempt, step=step)
            if stored is None:
                raise SagaOwnershipLostError(self.saga_id)
            self._recorded.setdefault(position, stored)
            self._check_position(position, tool.name, key)  # the row found there, if not ours

    def start(self, tool: Tool[Any], /, *args: object, **kwargs: object) -> asyncio.Task[Any]:
        """Start ``tool(*args, **kwargs)`` as a step in its own task (inside
        ``saga.parallel()``: one of the group). Its position is taken now, in
        the order of ``start`` calls, so a re-run places it the same way.
        Bad arguments raise here, before anything is stored."""
        if not isinstance(tool, Tool) or tool.ledger is not self.ledger:
            raise EffectLedgerValidationError(
                f"saga.start takes a tool of this saga's ledger, got {tool!r}", field="tool"
            )
        if self._closed or not self._entered:
            raise SagaError(f"saga {self.saga_id!r}: start() is for use inside the saga's block")
        call = tool.tool_call(*args, **kwargs)  # binds: bad arguments raise now
        return self._start(tool, call, tool(*args, **kwargs))

    def start_invoke(self, tool: Tool[Any], arguments: Mapping[str, object]) -> asyncio.Task[Any]:
        """``start`` with the arguments by name, as ``tool.invoke`` takes them."""
        if not isinstance(tool, Tool) or tool.ledger is not self.ledger:
            raise EffectLedgerValidationError(
                f"saga.start_invoke takes a tool of this saga's ledger, got {tool!r}",
                field="tool",
            )
        if self._closed or not self._entered:
            raise SagaError(f"saga {self.saga_id!r}: start() is for use inside the saga's block")
        # Bad arguments raise now; the same ToolCall invoke() makes.
        call = tool.call_for(arguments)
        return self._start(tool, call, tool.invoke(arguments))

    def _start(
        self, tool: Tool[Any], call: ToolCall, step: Coroutine[Any, Any, Any]
    ) -> asyncio.Task[Any]:
        """Check the step (its key: arguments that are not JSON raise; its
        position: a step other than the recorded one raises) before anything
        is stored or started, then start its task."""
        try:
            self._check_workflow(tool, call)
            key = self.ledger.idem_key(call)
            self._check_position(self._next_position, tool.name, key)
        except BaseException:
            step.close()  # never awaited: nothing ran
            raise
        position, group = self._place()
        context = contextvars.copy_context()
        context.run(reserve_step, self, position, group)
        task = asyncio.create_task(step, context=context)
        self._tasks.append((task, position))
        return task

    @contextlib.asynccontextmanager
    async def parallel(self) -> AsyncIterator[Saga]:
        """A group: steps started inside (``saga.start``) run concurrently and are
        undone together. The block's end waits for them all; if one failed, the
        others still running are waited for (those waiting for a person are
        canceled) and the first failure, by position, is raised."""
        if self._group is not None:
            raise SagaError(f"saga {self.saga_id!r}: parallel groups do not nest")
        self._group = self._next_group
        self._next_group += 1
        first = len(self._tasks)
        try:
            yield self
        finally:
            self._group = None
        tasks = self._tasks[first:]
        pending = {task for task, _ in tasks}
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            failed = [(p, t) for t, p in tasks if t.done() and _failure(t, p) is not None]
            if failed:
                await self._drain(cancel_waiting=True)
                position, task = min(failed, key=lambda f: f[0])
                error = _failure(task, position)
                assert error is not None
                raise error

    async def _drain(self, *, cancel_waiting: bool) -> None:
        """Wait for every started step; with ``cancel_waiting``, cancel the effects
        of those waiting for a person, so they end (their approve() returns False)."""
        while pending := [(t, p) for t, p in self._tasks if not t.done()]:
            if cancel_waiting:
                for _, position in pending:
                    key = self._keys.get(position)
                    effect = None if key is None else await self.ledger.find_by_idem_key(key)
                    # A parked step (an ambiguous attempt) is left to a person:
                    # cancelling it would hide a side effect that may have happened.
                    if effect is not None and effect.status in _WAITING and not effect.parked:
                        # Only while it still waits: claimed meanwhile (a person
                        # approved it), it is waited for and undone once it ends.
                        await cancel_for_rollback(self.ledger, effect.idem_key)
            await asyncio.wait([t for t, _ in pending], timeout=0.05 if cancel_waiting else None)
        for task, position in self._tasks:
            _failure(task, position)  # retrieved: the rollback reports the failures that matter

    # -- leaving -------------------------------------------------------------------

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Never swallows the block's exception: it leaves wrapped (SagaFailed)
        # or as it was (a cancellation, this saga's nondeterminism or lost ownership).
        self._closed = True
        try:
            await self._exit(exc)
        finally:
            try:
                if self._heartbeat is not None:
                    self._heartbeat.stop()
            finally:
                for token in reversed(self._tokens):
                    token.var.reset(token)
                self._scope.__exit__(None, None, None)

    async def _exit(self, exc: BaseException | None) -> bool:
        if self._replay_only:
            await self._drain(cancel_waiting=False)
            return False
        failure: BaseException | None = None
        if exc is None:
            try:
                failure = await self._stray_failure()
            except asyncio.CancelledError as cancelled:
                # Cancelled while waiting for a stray step: a cancellation
                # like any other (the block's code is done, its steps not).
                failure = cancelled
            if failure is None:
                self._check_every_step_reached()
                # Shielded: a cancellation now must not leave the saga running
                # with every step done; it propagates once this is stored.
                moved = await carry_through(
                    self._store.finish_saga(
                        self.saga_id,
                        attempt=self.attempt,
                        expect=_G.RUNNING,
                        then=_G.COMPLETED,
                        error=None,
                    )
                )
                if not moved:
                    raise SagaOwnershipLostError(self.saga_id)
                return False
            exc = failure
        if self._leaves_as_it_is(exc):
            # The code changed, or the saga is no longer ours: leave it as it is.
            await self._drain(cancel_waiting=False)
            if exc is not failure:
                return False
            raise exc
        if isinstance(exc, asyncio.CancelledError):
            await carry_through(self._roll_back(TASK_CANCELED))
            if exc is failure:
                raise exc
            return False  # the cancellation propagates
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt and the like: left to recover_sagas()
        reason = self._reason(exc)
        # Shielded too: a cancellation arriving during the undo waits for it to
        # end, then propagates instead of the SagaFailed.
        outcome = await carry_through(self._roll_back(reason))
        raise rolled_back(outcome) from exc

    def _reason(self, exc: Exception) -> EffectError:
        """The saga's error for a rollback ``exc`` caused: the error the failed
        step's effect recorded (the same in a run, a re-run and a replay), or,
        for an error of the block's own code, the exception's class and text."""
        for failed, error in self._failed_steps:
            if failed is exc:
                return error
        return EffectError(f"{type(exc).__name__}: {exc}", getattr(exc, "code", None))

    def _leaves_as_it_is(self, exc: BaseException) -> bool:
        """Whether ``exc`` says this saga must be left as it is: its code changed
        (``SagaNondeterminismError``), it was taken over, or a replay of it
        asked for a call the recording cannot answer (``UnrecordedEffectError``:
        the replayed code diverged, so undoing the recorded steps would undo
        what the code no longer does, and their undos were never recorded).
        Only this saga's own: an inner saga's ``SagaFailed`` (or any other
        error of another saga) raised in this block is a failed step of this
        one."""
        if isinstance(exc, UnrecordedEffectError):
            return True
        return (
            isinstance(exc, SagaNondeterminismError | SagaOwnershipLostError)
            and exc.saga_id == self.saga_id
        )

    def _check_every_step_reached(self) -> None:
        """A block that ended without reaching a recorded step diverged like one
        asking for another step: the saga is left running as it is (the code
        that reaches that step can still continue it), never `completed` with
        a step nobody asked for and nobody undoes."""
        unreached = sorted(p for p in self._recorded if p >= self._next_position)
        if unreached:
            step = self._recorded[unreached[0]]
            was = f"tool {step.tool!r} (key {step.idem_key[:12]}…)"
            asked = f"nothing (the block ended after {self._next_position} steps)"
            raise SagaNondeterminismError(self.saga_id, step.position, was, asked, ran=True)

    async def _stray_failure(self) -> BaseException | None:
        """Steps started outside ``parallel()`` are waited for at the block's end."""
        await self._drain(cancel_waiting=False)
        failed = sorted((p, t) for t, p in self._tasks if _failure(t, p) is not None)
        return _failure(failed[0][1], failed[0][0]) if failed else None

    async def _roll_back(self, reason: EffectError) -> SagaOutcome:
        moved = await self._store.finish_saga(
            self.saga_id,
            attempt=self.attempt,
            expect=_G.RUNNING,
            then=_G.COMPENSATING,
            error=reason,
        )
        await self._drain(cancel_waiting=True)
        if not moved:
            raise SagaOwnershipLostError(self.saga_id)
        saga = await self._store.get_saga(self.saga_id)
        assert saga is not None
        return await finish_compensation(self.ledger, self._store, saga)

    def __repr__(self) -> str:
        return f"<Saga {self.saga_id!r} attempt={self.attempt}>"


def _failure(task: asyncio.Task[Any], position: int) -> BaseException | None:
    """The step's failure; a cancelled step task is a failed step."""
    if task.cancelled():
        return SagaStepCancelled(position)
    return task.exception()
