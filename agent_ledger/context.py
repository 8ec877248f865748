"""Ambient state: what a call inherits from the code around it, in one module.

Some facts about a call are not its arguments but the block it is made in:
the workflow it belongs to (``ledger.workflow(id)``), the budgets it spends
from, the saga it is a step of, the replay answering it, the store step or
transaction it is inside. Each is a :class:`contextvars.ContextVar`, so
asyncio copies it into every task started inside the block and threads
started with ``copy_context()`` see it too.

Every such variable of the package is here, at the bottom of the layers, and
nowhere else: a reader sees in one file everything a call can inherit, and
the layers above read and change it only through these functions, never by
importing another layer's variable. This module knows none of those layers:
what it holds for them (a workflow scope, a budget scope, a saga) it keeps as
``object`` and compares by identity; the layer that put it there knows its
type (see :func:`step_runner`). Only what a lower layer must call has a
protocol here: :class:`Recording` (the ledger asks it) and
:class:`StepProgress` (the stores mark it).

Variables are created once, at import (a context variable is never
collected). Reading one costs a dictionary lookup.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar, Token
from typing import Protocol

from agent_ledger.effects import Effect, NewEffect

__all__ = [
    "OutcomeSlot",
    "Recording",
    "StepProgress",
    "adapter_run",
    "approved_by_framework",
    "budget_scopes",
    "budgets_gated",
    "check_recording_exit",
    "check_workflow_exit",
    "current_outcome_slot",
    "current_turn",
    "current_workflow",
    "enter_adapter_run",
    "enter_outcome_slot",
    "enter_recording",
    "enter_transaction",
    "enter_workflow",
    "exit_adapter_run",
    "exit_outcome_slot",
    "exit_recording",
    "exit_workflow",
    "framework_approval",
    "innermost_entry",
    "leave_transaction",
    "not_waiting_for_parked",
    "recording",
    "reserve_step",
    "reserved_step",
    "reset_step_progress",
    "set_step_runner",
    "step_progress",
    "step_runner",
    "suspend_budgets",
    "take_reserved_step",
    "track_step_progress",
    "transactions_entered",
    "waits_for_parked",
]


def innermost_entry(entered: Sequence[tuple[object, ...]], block: object) -> int:
    """Where ``block``'s latest entry is in ``entered`` (a context's stack of
    entries, innermost last, each starting with the block); raise
    ``RuntimeError`` (changing nothing) unless it is the innermost one.

    Each entry undoes itself by restoring what was in place before it: a
    block left before one entered inside it would restore a state that
    still holds the inner one, and the inner one's exit would bring the
    outer block back after both ended. So a block must be left before the
    block around it, as ``with`` statements always are. Shared by workflow
    scopes and replays, whose stacks are kept apart.
    """
    for i in range(len(entered) - 1, -1, -1):
        if entered[i][0] is block:
            if i != len(entered) - 1:
                inner = ", ".join(repr(e[0]) for e in entered[i + 1 :])
                raise RuntimeError(
                    f"{block!r} was exited before {inner}, entered inside it: leave "
                    "blocks in the reverse order of entering them (as `with` and "
                    "contextlib.ExitStack do); nothing was changed"
                )
            return i
    raise RuntimeError(f"{block!r} was exited in a context that did not enter it")


# -- the workflow and its budgets (ledger.workflow(), tools layer) -------------------

_WORKFLOW: ContextVar[str | None] = ContextVar("agent_ledger_workflow", default=None)
#: The turn of that workflow (``ledger.workflow(id, turn=...)``): one user
#: request, which ``scope="turn"`` tools key their calls by. Kept with the
#: workflow it was given for: (workflow id, turn id), or None.
_TURN: ContextVar[tuple[str, str] | None] = ContextVar("agent_ledger_turn", default=None)
#: The workflow scopes entered in this context, innermost last, with the tokens
#: that undo each. Kept in the context too, so one scope object entered by two
#: tasks or threads at once undoes each entry in the context that made it.
_WORKFLOW_SCOPES: ContextVar[
    tuple[
        tuple[
            object,
            Token[str | None],
            Token[tuple[object, ...]] | None,
            Token[tuple[str, str] | None],
        ],
        ...,
    ]
] = ContextVar("agent_ledger_workflow_scopes", default=())
#: The budget scopes in force, outermost first (the tools layer's ``BudgetScope``).
_BUDGETS: ContextVar[tuple[object, ...]] = ContextVar("agent_ledger_budgets", default=())
#: False inside a saga's compensations: an undo, and whatever it calls, is never refused.
_GATED: ContextVar[bool] = ContextVar("agent_ledger_budgets_gated", default=True)


def current_workflow() -> str | None:
    """The workflow id of the innermost ``ledger.workflow(...)`` around this code, or None."""
    return _WORKFLOW.get()


def current_turn(workflow_id: str | None = None) -> str | None:
    """The turn given to the innermost ``ledger.workflow(id, turn=...)`` around this
    code, or None (none given, or the innermost scope gave none).

    With ``workflow_id``: that turn only if it was given for that workflow
    (a tool registered with its own ``workflow_id`` is not in the block's turn).
    Inside ``ledger.replay(...)`` too it is the turn given, never another: a
    turn the recording lacks makes its calls unrecorded (the error says the
    turn differs and what to pass), so no call is answered by another turn's
    recorded result.
    """
    entry = _TURN.get()
    if entry is None or (workflow_id is not None and entry[0] != workflow_id):
        return None
    return entry[1]


def enter_workflow(
    scope: object, workflow_id: str, budget: object | None = None, turn: str | None = None
) -> None:
    """``scope`` is entered: its ``workflow_id`` and ``turn`` (None: no turn, even if
    an outer scope had one) and ``budget`` (if any, innermost of the budgets in
    force) hold in this context until :func:`exit_workflow`."""
    token = _WORKFLOW.set(workflow_id)
    budget_token = None if budget is None else _BUDGETS.set((*_BUDGETS.get(), budget))
    turn_token = _TURN.set(None if turn is None else (workflow_id, turn))
    _WORKFLOW_SCOPES.set((*_WORKFLOW_SCOPES.get(), (scope, token, budget_token, turn_token)))


def check_workflow_exit(scope: object) -> int:
    """Where ``scope``'s latest entry is in this context; raise ``RuntimeError``
    (changing nothing) unless it is the innermost (:func:`innermost_entry`)."""
    return innermost_entry(_WORKFLOW_SCOPES.get(), scope)


def exit_workflow(scope: object) -> None:
    """Undo ``scope``'s latest entry (which must be the innermost): the workflow
    and budgets around it hold again."""
    entered = _WORKFLOW_SCOPES.get()
    i = innermost_entry(entered, scope)
    _, token, budget_token, turn_token = entered[i]
    _WORKFLOW_SCOPES.set(entered[:i])
    _TURN.reset(turn_token)
    if budget_token is not None:
        _BUDGETS.reset(budget_token)
    _WORKFLOW.reset(token)


def budget_scopes() -> tuple[object, ...]:
    """The budget scopes entered around this code, outermost first (whether or
    not they apply here: see :func:`budgets_gated`)."""
    return _BUDGETS.get()


def budgets_gated() -> bool:
    """Whether budgets apply to calls made here (False inside a compensation)."""
    return _GATED.get()


def suspend_budgets() -> None:
    """No budget applies from here on in this context (a compensation's task)."""
    _GATED.set(False)


# -- the outcome of one tool call, for the adapters (Tool.call_outcome) --------------


class OutcomeSlot:
    """Where the engine leaves how it answered one call: the effect, and whether
    it ran the handler for this caller or answered from a receipt.

    ``Tool.call_outcome`` (the tools layer) puts one in the context for the
    call it makes, naming the call's key; the engine (``ledger.run``) fills it
    for the first call with that key made in this context, so tool calls the
    handler itself makes (other keys) never fill it. ``effect`` is None until
    then (a call refused before it reached the engine: a budget, a replay).
    """

    __slots__ = ("effect", "error", "idem_key", "replayed", "retryable")

    def __init__(self, idem_key: str) -> None:
        self.idem_key = idem_key
        #: The effect as the engine last saw it for this call.
        self.effect: Effect | None = None
        #: True: answered from a recorded outcome (this caller ran no handler).
        self.replayed = False
        #: The exception this call's handler failed with, once it is recorded
        #: (what the call raises: the tool's failure, not the ledger's).
        self.error: BaseException | None = None
        #: True: the handler's failure was recorded as retryable.
        self.retryable = False

    def fill(self, effect: Effect, *, replayed: bool) -> None:
        self.effect = effect
        self.replayed = replayed


_OUTCOME: ContextVar[OutcomeSlot | None] = ContextVar("agent_ledger_outcome", default=None)


def current_outcome_slot(idem_key: str) -> OutcomeSlot | None:
    """The slot waiting for the outcome of the call keyed ``idem_key``, or None."""
    slot = _OUTCOME.get()
    if slot is None or slot.idem_key != idem_key:
        return None
    return slot


def enter_outcome_slot(slot: OutcomeSlot) -> Token[OutcomeSlot | None]:
    """Calls made here with ``slot.idem_key`` report to ``slot``; the token undoes it
    (:func:`exit_outcome_slot`)."""
    return _OUTCOME.set(slot)


def exit_outcome_slot(token: Token[OutcomeSlot | None]) -> None:
    _OUTCOME.reset(token)


# -- sagas: the step runner, reserved positions, waiting for people ------------------

#: What runs a tool call made here as a step (a saga, above the tools layer,
#: which reads it through ``tools._tool.step_runner``); None outside sagas.
_STEP_RUNNER: ContextVar[object | None] = ContextVar("agent_ledger_step_runner", default=None)
#: A position reserved by ``saga.start()`` for the task it starts: (saga, position, group).
_RESERVED: ContextVar[tuple[object, int, int] | None] = ContextVar(
    "agent_ledger_saga_reserved", default=None
)
#: Whether an undo waits for a step parked for a person (the saga's own code,
#: whose caller waits anyway) or stops (a recovery pass, which other sagas wait for).
_WAIT_FOR_PARKED: ContextVar[bool] = ContextVar("agent_ledger_saga_wait_for_parked", default=True)


def step_runner() -> object | None:
    """The step runner tool calls made here hand their run to, or None.

    Kept as ``object``: the tools layer names its type (``StepRunner``) and
    checks it there."""
    return _STEP_RUNNER.get()


def set_step_runner(runner: object | None) -> Token[object | None]:
    """Make ``runner`` this context's step runner (None: calls are not steps);
    the token undoes it (``token.var.reset(token)``)."""
    return _STEP_RUNNER.set(runner)


def reserve_step(saga: object, position: int, group: int) -> None:
    """Keep ``position`` in ``group`` of ``saga`` for the first step made in this
    context (``saga.start()`` runs it in a copied context)."""
    _RESERVED.set((saga, position, group))


def reserved_step() -> tuple[object, int, int] | None:
    """The position reserved in this context: (saga, position, group), or None."""
    return _RESERVED.get()


def take_reserved_step() -> None:
    """The reserved position is used: the next call here is placed as usual."""
    _RESERVED.set(None)


def waits_for_parked() -> bool:
    """Whether an undo made here waits for a step parked for a person."""
    return _WAIT_FOR_PARKED.get()


@contextlib.contextmanager
def not_waiting_for_parked() -> Iterator[None]:
    """Inside: an undo stops at a step parked for a person (a recovery pass)."""
    token = _WAIT_FOR_PARKED.set(False)
    try:
        yield
    finally:
        _WAIT_FOR_PARKED.reset(token)


# -- replay: the recording answering this context's calls ----------------------------


class Recording(Protocol):
    """What answers one ledger's calls instead of running them (``ledger.replay()``).

    The replay layer (``agent_ledger.replay``, far above) enters one for its
    block; the ledger asks it about each call once the call is checked and
    keyed, before anything is stored, and the engine never knows.
    """

    @property
    def ledger(self) -> object:
        """The ledger whose calls it answers (another ledger's run as usual)."""
        ...

    async def answer(self, new: NewEffect, legacy_key: str | None = None) -> Effect | None:
        """The finished effect to answer ``new`` from; None to run it as usual.

        ``legacy_key``: the call's 0.2.x key (``legacy_keys=True``), which the
        recorded run may have been answered under (an imported effect).
        Raises to refuse the call (``UnrecordedEffectError``) before anything runs.
        """
        ...

    async def recorded(self, idem_key: str) -> Effect | None:
        """The finished effect recorded under ``idem_key``, or None: for layers that read
        an effect's receipt rather than call it (a saga settling a step to undo)."""
        ...


#: The recording answering this context's calls, or None (almost always):
#: reading it is all a call pays for replay.
RECORDING: ContextVar[Recording | None] = ContextVar("agent_ledger_recording", default=None)
#: The recordings entered in this context, innermost last, with the tokens that
#: undo each entry (as for workflow scopes).
_RECORDINGS: ContextVar[tuple[tuple[Recording, Token[Recording | None]], ...]] = ContextVar(
    "agent_ledger_replays", default=()
)


def recording() -> Recording | None:
    """The recording answering calls made here, or None."""
    return RECORDING.get()


def enter_recording(entered: Recording) -> None:
    """``entered`` answers this context's calls until :func:`exit_recording`."""
    token = RECORDING.set(entered)
    _RECORDINGS.set((*_RECORDINGS.get(), (entered, token)))


def check_recording_exit(entered: Recording) -> int:
    """Raise ``RuntimeError`` (changing nothing) unless ``entered`` is the
    innermost recording of this context (:func:`innermost_entry`)."""
    return innermost_entry(_RECORDINGS.get(), entered)


def exit_recording(entered: Recording) -> None:
    """Undo ``entered``'s latest entry (which must be the innermost)."""
    stack = _RECORDINGS.get()
    i = innermost_entry(stack, entered)
    _RECORDINGS.set(stack[:i])
    RECORDING.reset(stack[i][1])


# -- stores: the step in flight, the transactions entered ----------------------------


class StepProgress:
    """Whether a store step is still waiting before doing any work.

    A caller that gives up (is cancelled) while a step that may make it an
    effect's owner is in flight must wait for that step to end: it cannot
    tell whether the store applied it (``engine.ownership``). A step that
    first waits for another task's open transaction (MemoryStore's and
    SqliteStore's gate) has done nothing yet, and cancelling it there changes
    nothing stored: it says so (``stores.base.waiting_before_work``), and the
    caller may then cancel it instead of waiting out someone else's
    transaction.
    """

    __slots__ = ("waiting",)

    def __init__(self) -> None:
        self.waiting = False


#: The progress of the step the caller is starting (set by the engine around a
#: step it may abandon; None otherwise).
_STEP_PROGRESS: ContextVar[StepProgress | None] = ContextVar(
    "agent_ledger_step_progress", default=None
)
#: The transactions whose block the running code is inside, of any store (the
#: stores' transaction handles): set by ``transaction()`` for its block and
#: inherited by every task started there.
_TRANSACTIONS: ContextVar[tuple[object, ...]] = ContextVar(
    "agent_ledger_inside_transactions", default=()
)


def step_progress() -> StepProgress | None:
    """The progress of the store step being started here, if someone tracks it."""
    return _STEP_PROGRESS.get()


def track_step_progress(progress: StepProgress) -> Token[StepProgress | None]:
    """Track the step about to start here in ``progress``; the token stops it
    (:func:`reset_step_progress`)."""
    return _STEP_PROGRESS.set(progress)


def reset_step_progress(token: Token[StepProgress | None]) -> None:
    _STEP_PROGRESS.reset(token)


def transactions_entered() -> tuple[object, ...]:
    """The transaction handles whose block this code runs in, of any store."""
    return _TRANSACTIONS.get()


def enter_transaction(handle: object) -> None:
    """This context is inside ``handle``'s block (and so is every task started here)."""
    _TRANSACTIONS.set((*_TRANSACTIONS.get(), handle))


def leave_transaction(handle: object) -> None:
    """``handle``'s transaction ended: this context is no longer inside it."""
    _TRANSACTIONS.set(tuple(h for h in _TRANSACTIONS.get() if h is not handle))


# -- a framework adapter's run of one tool call (agent_ledger.adapters) --------------

#: The adapter's record of the tool call being run here (a LangChain run: the
#: framework's tool-call id, whether the function started), for the function
#: the framework calls, which the framework gives no way to receive it.
_ADAPTER_RUN: ContextVar[object | None] = ContextVar("agent_ledger_adapter_run", default=None)
#: Who approved, through the framework's own human-in-the-loop (LangChain's
#: HumanInTheLoopMiddleware), the tool call being run here; None if nobody did.
_FRAMEWORK_APPROVAL: ContextVar[str | None] = ContextVar(
    "agent_ledger_framework_approval", default=None
)


def adapter_run() -> object | None:
    """The adapter's record of the tool call run here, or None outside one."""
    return _ADAPTER_RUN.get()


def enter_adapter_run(run: object) -> Token[object | None]:
    """``run`` is the tool call run here until :func:`exit_adapter_run` with the token."""
    return _ADAPTER_RUN.set(run)


def exit_adapter_run(token: Token[object | None]) -> None:
    _ADAPTER_RUN.reset(token)


def framework_approval() -> str | None:
    """Who approved the tool call run here through the framework, or None."""
    return _FRAMEWORK_APPROVAL.get()


@contextlib.contextmanager
def approved_by_framework(by: str) -> Iterator[None]:
    """Inside the block, the tool call being run was approved by ``by`` through
    the framework's own human-in-the-loop (the ledger records that decision)."""
    token = _FRAMEWORK_APPROVAL.set(by)
    try:
        yield
    finally:
        _FRAMEWORK_APPROVAL.reset(token)
