"""Every exception agent-ledger raises, under one base class.

::

    EffectLedgerError
    ├── EffectFailedError            the recorded outcome is a failure
    ├── EffectDeniedError            the effect was denied or canceled
    ├── EffectTimeoutError           waiting for another caller took too long
    │   └── HandlerTimeoutError      the handler itself ran past its deadline (timeout_ms)
    ├── EffectInFlightError          inside a transaction, someone else holds the effect
    ├── ApprovalPendingError         the call asked not to wait for a person, and one must decide
    ├── EffectPayloadMismatchError   same key, different values of validated args
    ├── UnrecordedEffectError        a strict replay met a call its recording cannot answer
    ├── EffectLedgerValidationError  bad input; nothing was stored
    │   └── BudgetMismatchError      a workflow id already has a budget with other limits
    ├── BudgetExceededError          a call did not fit its workflow's budget; it did not run
    ├── EffectStoreError             the backend failed (wraps the driver error)
    └── EffectLedgerInvariantError   a store broke its contract (a bug)

Handler exceptions are never wrapped: ``run()`` re-raises what the handler
raised, after recording it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

from agent_ledger.codes import ErrorCode

if TYPE_CHECKING:
    from agent_ledger.effects import Effect
    from agent_ledger.status import EffectStatus

__all__ = [
    "ApprovalIntentChangedError",
    "ApprovalPendingError",
    "BudgetExceededError",
    "BudgetMismatchError",
    "DecisionRefusedError",
    "EffectDeniedError",
    "EffectFailedError",
    "EffectInFlightError",
    "EffectLedgerError",
    "EffectLedgerInvariantError",
    "EffectLedgerPermissionError",
    "EffectLedgerValidationError",
    "EffectPayloadMismatchError",
    "EffectStoreError",
    "EffectTimeoutError",
    "HandlerTimeoutError",
    "RetryableToolError",
    "UnrecordedEffectError",
]


class EffectLedgerError(Exception):
    """Base class of every error raised by agent-ledger itself."""


class EffectFailedError(EffectLedgerError):
    """Raised when the effect's recorded outcome is a failure.

    A replay of a failed effect raises this instead of running the handler
    again: the first failure is the receipt. ``message`` and ``code`` are the
    original error's.
    """

    def __init__(self, effect: Effect, *legacy: object) -> None:
        # ``legacy``: only so that 0.2.x's two-argument form gets guidance.
        if isinstance(effect, str) or legacy:
            raise RemovedNameError(
                "EffectFailedError(idem_key, effect_error)",
                "this version's is EffectFailedError(effect), built by the ledger from the "
                "recorded effect (.message, .code and .effect replace .effect_error); to fail "
                "a call, raise your own exception from the handler, or commit CommitFailed",
            )
        error = effect.error
        self.effect = effect
        self.message = error.message if error is not None else "effect failed"
        self.code = error.code if error is not None else None
        #: The tool declared this failure retryable: calling again with the same
        #: key (same args, same scope) runs the tool again, as a new attempt.
        self.retryable = effect.retryable
        #: What the caller may do about it (also a note on the exception, which
        #: tracebacks show): call again if retryable, else the remedy.
        self.remedy = (RETRYABLE_REMEDY if self.retryable else FINAL_REMEDY).format(
            key=effect.idem_key
        )
        suffix = f" [{self.code}]" if self.code else ""
        super().__init__(f"effect {effect.idem_key[:12]}… failed{suffix}: {self.message}")
        self.add_note(self.remedy)


#: What a caller may do about a failure its tool declared retryable.
RETRYABLE_REMEDY: Final = (
    "The tool declared this failure retryable: call it again with the same arguments "
    "(in the same workflow and scope) to run it again as a new attempt."
)
#: What a caller may do about a failure recorded as final (the default).
FINAL_REMEDY: Final = (
    "This failure is final for its key, and every repeat is answered with it: fix the "
    "cause, then `agent-ledger retry {key} --by NAME --reason WHY` (ledger.reopen) to "
    "run it again, or call it in a new scope (a new turn for scope='turn', a new "
    "call_id for scope='call'); a tool can declare failures retryable (retryable=)."
)


class RetryableToolError(EffectLedgerError):
    """Raise it from a tool to fail this call *retryably*: the failure is recorded
    (the receipt says it is retryable, and keeps it in the history), and the
    next call with the same key runs the tool again as a new attempt, instead
    of being answered with the failure.

    For tools whose own error means "try again" (a model asking for other
    input, a transient outage): adapters map their framework's retry signal
    onto it. ``code`` is recorded as the error's code (default: the class
    name). A tool can instead declare which of its exceptions are retryable
    with ``retryable=`` (exception types or a predicate).
    """

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: None: the class name is recorded.
        self.code = code


class EffectDeniedError(EffectLedgerError):
    """Raised when the effect was denied by a human or canceled.

    ``status`` is ``denied`` or ``canceled``; ``reason`` is what the decider
    gave, if anything. The handler did not run (or its run was abandoned).
    """

    def __init__(self, effect: Effect, *legacy: object, **legacy_reason: object) -> None:
        # ``legacy`` and ``legacy_reason``: only so that 0.2.x's form gets guidance.
        if isinstance(effect, str) or legacy or legacy_reason:
            raise RemovedNameError(
                "EffectDeniedError(idem_key, reason)",
                "this version's is EffectDeniedError(effect), built by the ledger from the "
                "denied or canceled effect (.reason, .status and .effect); to refuse a call, "
                "deny() it (ledger.deny(key, reason))",
            )
        self.effect = effect
        self.status = effect.status
        self.reason = effect.error.message if effect.error is not None else None
        because = f": {self.reason}" if self.reason else ""
        super().__init__(f"effect {effect.idem_key[:12]}… was {effect.status.value}{because}")


class EffectTimeoutError(EffectLedgerError):
    """Raised when waiting for another caller's outcome exceeded its limit.

    The effect is left as it is: a later call with the same key picks it up
    (replays the outcome, or waits again). ``waited_ms`` says how long this
    call waited and ``status`` what it was waiting on: None when another
    transaction held the key the whole time (an uncommitted insert or claim
    of it, or, on SQLite, the write lock), so this call never saw the effect,
    and stored nothing.
    """

    def __init__(
        self, idem_key: str, status: EffectStatus | None, waited_ms: float, limit_ms: int
    ) -> None:
        self.idem_key = idem_key
        self.status = status
        self.waited_ms = waited_ms
        self.limit_ms = limit_ms
        if status is None:
            what = "another transaction holding its key (not committed yet)"
            where = f"effect {idem_key[:12]}… was not stored by this call"
        else:
            what = "approval" if status == "requires_approval" else "the worker running it"
            where = f"effect {idem_key[:12]}… is still {status.value}"
        super().__init__(
            f"gave up after waiting {waited_ms:.0f} ms (limit {limit_ms} ms) for {what}; "
            f"{where}. Call again later to pick up its outcome, or raise the limit in "
            "ConcurrencyOptions."
        )


#: The error code an effect is recorded with when its handler ran past its deadline
#: (an alias of ``ErrorCode.HANDLER_TIMEOUT``, kept for code that imports it from here).
HANDLER_TIMEOUT: Final = ErrorCode.HANDLER_TIMEOUT

_LIMIT = re.compile(r"\(timeout_ms=(\d+)\)")
_RAN = re.compile(r"after (\d+) ms")


class HandlerTimeoutError(EffectTimeoutError):
    """Raised when the handler, not a wait, ran out of time: ``RunOptions(timeout_ms=...)``.

    Unlike its base class, the effect is *not* left as it was: it is
    recorded with the code ``handler_timeout``, as ``canceled`` when the
    handler was cancelled at its deadline (its side effect may or may not
    have happened) or as ``failed`` when it returned (or raised) only after
    it (a plain handler in a thread cannot be interrupted; a returned value
    is kept as the effect's ``result``, for a person to see, but never handed
    to a caller). Either way it is not run again automatically: a replay of
    the call raises this same error, and ``reopen()`` is how a person runs it
    again. ``effect`` is the effect as recorded; ``limit_ms`` the deadline
    and ``ran_ms`` how long the handler ran (``waited_ms`` too, for code that
    handles every ``EffectTimeoutError``).
    """

    def __init__(self, effect: Effect) -> None:
        error = effect.error
        message = error.message if error is not None else "the handler ran past its deadline"
        limit = _LIMIT.search(message)
        ran = _RAN.search(message)
        self.effect = effect
        self.idem_key = effect.idem_key
        self.status = effect.status
        self.limit_ms = int(limit.group(1)) if limit else 0
        self.ran_ms = float(ran.group(1)) if ran else 0.0
        self.waited_ms = self.ran_ms
        self.message = message
        self.code = ErrorCode.HANDLER_TIMEOUT
        # EffectTimeoutError.__init__ words a wait; this one words the handler.
        Exception.__init__(
            self,
            f"the handler of effect {effect.idem_key[:12]}… ({effect.tool}) ran out of time "
            f"[{ErrorCode.HANDLER_TIMEOUT}], recorded {effect.status.value}: {message}",
        )


def is_handler_timeout(effect: Effect) -> bool:
    """Whether ``effect`` was recorded as a handler that ran past its deadline."""
    return effect.error is not None and effect.error.code == ErrorCode.HANDLER_TIMEOUT


class EffectInFlightError(EffectLedgerError):
    """Raised inside a caller's transaction when someone else holds the effect.

    Waiting there would hold the transaction's locks against the holder (its
    heartbeats and its commit would queue behind them) and could end in a
    takeover of a live worker. So ``run(..., tx=...)`` and ``begin(..., tx=...)``
    never wait: they raise this at once, and nothing is changed. ``status``
    says what the effect is doing (``processing`` elsewhere, or waiting for
    approval); it is None when another *transaction* holds the key (an
    uncommitted insert or claim of it) and did not let go within
    ``lock_timeout_ms``. The caller's transaction stays usable either way.

    A store step *outside* a transaction that was given ``lock_timeout_ms``
    raises it too (``status=None``) when that lock wait runs out, having
    changed nothing; ``run()`` then tries again within its
    ``wait_timeout_ms`` and raises ``EffectTimeoutError`` past it.
    """

    def __init__(
        self,
        idem_key: str,
        status: EffectStatus | None,
        *,
        lock_timeout_ms: int | None = None,
    ) -> None:
        self.idem_key = idem_key
        self.status = status
        self.lock_timeout_ms = lock_timeout_ms
        if status is None:
            doing = (
                f"held by another transaction, which did not release it within {lock_timeout_ms} ms"
            )
        elif status == "requires_approval":
            doing = f"waiting for a person's approval ({status.value})"
        else:
            doing = f"being run by another worker ({status.value})"
        super().__init__(
            f"effect {idem_key[:12]}… is {doing}; inside a transaction the ledger does "
            "not wait for it or take it over, and changed nothing. End the transaction "
            "first, then call again without tx= to wait for its outcome."
        )


class ApprovalPendingError(EffectLedgerError):
    """Raised instead of waiting when a person must decide and the call said not to wait.

    ``RunOptions(wait_for_approval=False)`` is for callers that cannot block
    on a person (an agent framework that pauses its own way, a web request):
    the effect stays ``requires_approval`` in the store, exactly as a waiting
    call would leave it, and nothing ran. Call again (the same call, so the
    same key) after ``approve()`` to run it, or after ``deny()`` to get
    ``EffectDeniedError``. ``effect`` is the effect as found.
    """

    def __init__(self, effect: Effect) -> None:
        self.effect = effect
        self.idem_key = effect.idem_key
        super().__init__(
            f"effect {effect.idem_key[:12]}… ({effect.tool}) is waiting for a person's "
            "approval, and this call asked not to wait (wait_for_approval=False). Nothing "
            "ran. Call again after approve() to run it; after deny() the call raises "
            "EffectDeniedError."
        )


class DecisionRefusedError(EffectLedgerError):
    """A decision made in code or from the CLI was refused for a reason other than
    "someone decided first" (those return False): the approval's deadline had
    passed (``reason`` ``expired``: the effect is now denied as expired), or
    the intent changed. ``reason`` is the ``DecisionCode`` recorded in the
    decision audit trail; ``effect`` is the effect as found. Nothing was
    decided.
    """

    def __init__(self, message: str, *, reason: str, effect: Effect | None) -> None:
        self.reason = reason
        self.effect = effect
        super().__init__(message)


class ApprovalIntentChangedError(EffectLedgerError):
    """An approved effect was claimed inside a caller's transaction (``tx=``), and
    what would run differs from what its approval was bound to (tool, workflow,
    arguments or the ledger's ``approval_policy_version``). Nothing ran; the
    transaction's rollback undoes the claim. Run the call outside a
    transaction: it sends the effect back to a person (the refusal is in the
    decision audit trail, reason ``intent_mismatch``)."""

    def __init__(self, effect: Effect, why: str) -> None:
        self.effect = effect
        self.idem_key = effect.idem_key
        super().__init__(f"effect {effect.idem_key[:12]}… ({effect.tool}): {why}")


class EffectPayloadMismatchError(EffectLedgerError):
    """Raised when a call reuses an effect's key with different validated args.

    The call named ``validate_keys`` (``ToolCall.validate_keys``, or a tool's
    ``validate_keys=``), and the effect already stored under its key was
    made with other values of ``fields``. Raised as soon as the existing
    effect is found: the handler does not run, nobody waits, and the stored
    effect keeps its status, args and outcome (its ``dedup_count`` does
    count the refused call, as for any call that found it). ``effect`` is
    the stored effect, as found; ``effect.args`` has its values.
    """

    def __init__(self, effect: Effect, fields: tuple[str, ...]) -> None:
        self.effect = effect
        self.fields = fields
        super().__init__(
            f"effect {effect.idem_key[:12]}… ({effect.tool}, {effect.status.value}) was "
            f"made with different values of {list(fields)}; a call with the same key must "
            "repeat them. Nothing was run or changed. Use a new key for a different request."
        )


class UnrecordedEffectError(EffectLedgerError):
    """Raised in a strict ``ledger.replay()`` by a call the recording has no outcome for.

    The replayed code asked for something the recorded run did not (other
    args, another tool, another workflow), or for a call the recording holds
    but that had not finished when it was made (``recorded_status`` says how
    far it got). Raised before any handler runs; nothing is stored anywhere.
    The message names the tool and the args that differ from the closest
    recorded call of that tool. Not a validation error on purpose: code that
    turns bad input into an error result for a model (the adapters) must
    not swallow a replay that went off its recording.

    ``workflow_id``, ``tool`` and ``idem_key`` are the call's;
    ``differing`` the names of the args that differ from the closest
    recorded call of that tool (empty when none was recorded).
    """

    def __init__(
        self,
        message: str,
        *,
        workflow_id: str,
        tool: str,
        idem_key: str,
        differing: tuple[str, ...] = (),
        recorded_status: EffectStatus | None = None,
    ) -> None:
        self.workflow_id = workflow_id
        self.tool = tool
        self.idem_key = idem_key
        self.differing = differing
        self.recorded_status = recorded_status
        super().__init__(message)


class EffectLedgerValidationError(EffectLedgerError, ValueError):
    """Raised for bad input: a malformed call, non-JSON args or result, bad options.

    Nothing stored changes when this is raised, with one documented exception:
    a handler result that cannot be serialized is recorded as a failure first,
    so the effect does not stay in ``processing``. ``field`` names the input
    that was wrong.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class BudgetMismatchError(EffectLedgerValidationError):
    """Raised when a workflow id already has a stored budget with other limits.

    A budget is stored once per workflow id and shared by every worker and
    restart; quietly using either set of limits would let one process spend
    what another forbade. Nothing was changed and nothing ran. Use the stored
    limits (``agent-ledger budget show ID``), or a new workflow id.
    """

    def __init__(self, workflow_id: str, stored: object, given: object) -> None:
        self.workflow_id = workflow_id
        self.stored = stored
        self.given = given
        super().__init__(
            f"workflow {workflow_id!r} already has a budget {stored!r}; this call gave "
            f"{given!r}. A budget's limits are fixed when it is first stored, so every "
            "worker enforces the same ones. Nothing ran. Pass the stored limits, or use "
            "a new workflow id.",
            field="budget",
        )


class BudgetExceededError(EffectLedgerError):
    """Raised *before* a model or tool call runs, when it does not fit its budget.

    The call's estimate did not fit in ``spent + reserved + estimate <= limit``
    for some unit (``units``), so nothing was reserved, the provider or
    handler was not called and no effect was created. ``budget`` is the
    budget as read just after the refusal (``agent_ledger.budgets.BudgetState``,
    or None if it could not be read), ``workflow_id`` the budget's id and
    ``tool`` the refused call's tool name.
    """

    def __init__(self, workflow_id: str, tool: str, units: tuple[str, ...], budget: object) -> None:
        self.workflow_id = workflow_id
        self.tool = tool
        self.units = units
        self.budget = budget
        which = ", ".join(units) if units else "its limits"
        super().__init__(
            f"{tool}: workflow {workflow_id!r} has no budget left for this call ({which}); "
            "it was not run. See `agent-ledger budget show` for what was spent and "
            "reserved."
        )


class EffectStoreError(EffectLedgerError):
    """Raised when the store's backend failed; the driver error is ``__cause__``.

    ``operation`` names the ledger step (``begin``, ``commit``, ...) and
    ``idem_key``/``effect_id`` the effect it was about, so a log line is enough
    to find the receipt. ``too_long`` is True when the store refused a value
    as longer than it holds (MySQL's "data too long", SQLite's "string or blob
    too big"): trying the same statement again is certain to fail the same way.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        idem_key: str | None = None,
        effect_id: str | None = None,
        too_long: bool = False,
    ) -> None:
        self.operation = operation
        self.idem_key = idem_key
        self.effect_id = effect_id
        self.too_long = too_long
        about = idem_key or effect_id
        where = f" (effect {about})" if about else ""
        super().__init__(f"store {operation} failed{where}: {message}")


class EffectLedgerPermissionError(EffectStoreError):
    """The database refused a step to the role the store connects as (SQLSTATE 42501).

    With the PostgreSQL role set installed (``agent-ledger init --roles``,
    docs/postgres.md "Roles"), ``code`` says which refusal: ``not_an_approver``
    (a decision by a role that is not a member of the approver role; grant
    it, as ``grant`` spells out), ``self_decision`` (separation of duty: the
    identity that asked for the approval tried to decide it), or None for
    any other missing privilege (``grant`` then names the role the step
    needs, when known). Nothing changed: the statement was rolled back.
    """

    def __init__(
        self,
        message: str,
        *,
        operation: str,
        code: str | None,
        grant: str | None = None,
        idem_key: str | None = None,
        effect_id: str | None = None,
    ) -> None:
        self.code = code
        self.grant = grant
        self.sqlstate = "42501"
        super().__init__(message, operation=operation, idem_key=idem_key, effect_id=effect_id)


class EffectLedgerInvariantError(EffectLedgerError):
    """Raised when a store returned something its contract rules out.

    This is a bug in a store (or a hand-edited database), never a user error.
    """


class RemovedNameError(ImportError):
    """A name (or call shape) of agent-ledger 0.2.x with no equivalent in this version.

    Documented as ``agent_ledger.legacy.names.RemovedNameError`` (see there
    for why it is an ``ImportError``). Defined here, in the lowest layer, so
    that this module's own 0.2.x constructors can raise it too. ``owner`` is
    where 0.2.x had the name: a module, or a class for its methods.
    """

    def __init__(self, name: str, advice: str, *, owner: str = "agent_ledger") -> None:
        super().__init__(
            f"{owner}.{name} (agent-ledger 0.2.x) has no equivalent here: {advice}; "
            "see docs/migrating-from-0.2.md",
            name=owner,
        )


RemovedNameError.__module__ = "agent_ledger.legacy.names"


def require_str(value: object, name: str) -> None:
    """Raise ``EffectLedgerValidationError`` naming ``name`` unless ``value`` is a str."""
    if not isinstance(value, str):
        raise EffectLedgerValidationError(
            f"{name} must be a string, got {type(value).__name__}", field=name
        )


# The errors ``import agent_ledger`` exports: tracebacks say ``agent_ledger.X``.
# The others keep this module's name, where they are imported from.
for _cls in (
    EffectLedgerError,
    EffectFailedError,
    EffectDeniedError,
    ApprovalPendingError,
    EffectLedgerValidationError,
    EffectStoreError,
    BudgetExceededError,
):
    _cls.__module__ = "agent_ledger"
