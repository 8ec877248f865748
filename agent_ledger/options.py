"""Run options, their defaults, and how per-call options merge over ledger defaults.

Every field starts as :data:`UNSET`. Merging goes field by field, through
nested options too: a field left unset falls through to the ledger's
default and then to the built-in default; a field set explicitly, even to
``None``, wins. ``None`` means "the built-in default" for ``concurrency`` and
``stale``, and "wait indefinitely" for ``approval_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Final, Literal, TypeAlias, TypeVar

from agent_ledger.backoff import MAX_MS, Backoff, too_many_ms
from agent_ledger.clock import Clock, utc_now
from agent_ledger.effects import DEFAULT_STALE_AFTER_MS as DEFAULT_STALE_AFTER_MS  # its home
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.retries import Retryable, RetryPolicy, check_retryable

if TYPE_CHECKING:
    from agent_ledger.calls import ToolCall
    from agent_ledger.effects import Effect
    from agent_ledger.stores.base import Store


class _UnsetType(enum.Enum):
    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


#: Marker for "not set here; fall through to the next level of defaults".
UNSET: Final = _UnsetType.UNSET
Unset: TypeAlias = Literal[_UnsetType.UNSET]

#: How long a step inside a caller's transaction may wait for a lock another
#: transaction holds, unless ``wait_timeout_ms`` was set; see ``ConcurrencyOptions``.
DEFAULT_TX_LOCK_TIMEOUT_MS: Final = 1_000


#: The longest ``StaleOptions.after_ms``: PostgreSQL keeps each effect's lease
#: in a 32-bit integer column, so about 24.8 days.
MAX_LEASE_MS: Final = 2**31 - 1


def _check_int(
    value: object,
    name: str,
    *,
    unit: str = "milliseconds",
    allow_none: bool = False,
    positive: bool = False,
    maximum: int | None = MAX_MS,
) -> None:
    """Refuse what is not an int in range; ``maximum`` (default ``MAX_MS``) bounds times."""
    if value is UNSET or (allow_none and value is None):
        return
    if type(value) is not int:
        kind = "an int or None" if allow_none else "an int"
        raise EffectLedgerValidationError(
            f"{name} must be {kind} ({unit}), got {value!r}", field=name
        )
    if value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        shown = value if value.bit_length() < 200 else "a huge negative int"
        raise EffectLedgerValidationError(f"{name} must be {bound}, got {shown}", field=name)
    if unit == "milliseconds" and maximum is not None:
        refused = too_many_ms(value, name, maximum)
        if refused is not None:
            raise EffectLedgerValidationError(refused, field=name)


#: agent-ledger 0.2.x's options in seconds (its ``ConcurrencyOptions``) -> the
#: millisecond option here. 0.2.x's other option names are the same here.
SECONDS_OPTIONS_0_2: Final = {
    "effect_timeout_s": "ConcurrencyOptions(wait_timeout_ms=...)",
    "approval_timeout_s": "ConcurrencyOptions(approval_timeout_ms=...)",
    "initial_interval_s": "ConcurrencyOptions(initial_interval_ms=...)",
    "max_interval_s": "ConcurrencyOptions(max_interval_ms=...)",
}

_Cls = TypeVar("_Cls", bound=type)


def _refuse_0_2_seconds(cls: _Cls) -> _Cls:
    """Make a 0.2.x option in seconds a validation error naming the ms spelling.

    Only a failed construction looks at the names (the TypeError for an
    unexpected keyword), so building options costs nothing more.
    """
    init = vars(cls)["__init__"]

    @functools.wraps(init)
    def __init__(self: object, *args: object, **kwargs: object) -> None:
        try:
            init(self, *args, **kwargs)
        except TypeError:
            for name in kwargs:
                if name in SECONDS_OPTIONS_0_2:
                    raise EffectLedgerValidationError(
                        f"{name} is agent-ledger 0.2.x's option in seconds; use "
                        f"{SECONDS_OPTIONS_0_2[name]} (milliseconds) "
                        "(see docs/migrating-from-0.2.md)",
                        field=name,
                    ) from None
            raise

    type.__setattr__(cls, "__init__", __init__)
    return cls


def _check_number(value: object, name: str, low: float, high: float | None) -> None:
    if value is UNSET:
        return
    if type(value) not in (int, float):
        raise EffectLedgerValidationError(f"{name} must be a number, got {value!r}", field=name)
    number = float(value)  # type: ignore[arg-type]
    if not (number >= low and (high is None or number <= high)):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise EffectLedgerValidationError(f"{name} must be in {span}, got {value}", field=name)


@_refuse_0_2_seconds
@dataclass(frozen=True, slots=True)
class ConcurrencyOptions:
    """How a caller waits while another caller holds the same effect.

    Defaults: ``wait_timeout_ms=30_000``, ``approval_timeout_ms=None`` (wait
    for a human indefinitely), polling from ``initial_interval_ms=50`` up to
    ``max_interval_ms=1_000``, multiplying by ``backoff_multiplier=1.5`` with
    ±``jitter_factor=0.3`` randomness. Stores that can notify (Memory,
    Postgres) wake waiters early; polling is the fallback.

    Inside a caller's transaction (``tx=``) the ledger never waits for
    another worker, but a step may still meet a lock another transaction
    holds on the same key (PostgreSQL: an uncommitted insert of it, or a
    claim of it). That wait lasts at most ``wait_timeout_ms`` when it was
    set (here or in the ledger's defaults), else ``DEFAULT_TX_LOCK_TIMEOUT_MS``
    (1 s): the built-in 30 s would hold the caller's own locks that long.
    """

    wait_timeout_ms: int | Unset = UNSET
    approval_timeout_ms: int | Unset | None = UNSET
    initial_interval_ms: int | Unset = UNSET
    max_interval_ms: int | Unset = UNSET
    backoff_multiplier: float | Unset = UNSET
    jitter_factor: float | Unset = UNSET

    def __post_init__(self) -> None:
        _check_int(self.wait_timeout_ms, "wait_timeout_ms")
        _check_int(self.approval_timeout_ms, "approval_timeout_ms", allow_none=True)
        _check_int(self.initial_interval_ms, "initial_interval_ms", positive=True)
        _check_int(self.max_interval_ms, "max_interval_ms", positive=True)
        _check_number(self.backoff_multiplier, "backoff_multiplier", 1.0, None)
        _check_number(self.jitter_factor, "jitter_factor", 0.0, 1.0)
        _check_interval_order(self.initial_interval_ms, self.max_interval_ms)


def _check_interval_order(initial: int | Unset, maximum: int | Unset) -> None:
    if initial is not UNSET and maximum is not UNSET and initial > maximum:
        raise EffectLedgerValidationError(
            f"initial_interval_ms ({initial}) must not exceed max_interval_ms ({maximum})",
            field="initial_interval_ms",
        )


@_refuse_0_2_seconds
@dataclass(frozen=True, slots=True)
class StaleOptions:
    """When a ``processing`` effect counts as abandoned and may be taken over.

    ``after_ms`` (default 15 000) is how long the holder may go without a
    heartbeat; ``0`` disables takeover. ``run()`` heartbeats every
    ``after_ms / 3`` while the handler runs, so only a dead (or blocked) worker
    goes stale. The default is short enough that, after a crash, a caller
    waiting with the default 30 s ``wait_timeout_ms`` takes the effect over
    instead of timing out, and long enough to ride out GC pauses and a busy
    event loop.

    ``max_takeovers`` (default 3) bounds how often one effect may be taken
    over. A handler that keeps outliving its lease (blocking the event loop,
    say) would otherwise be re-run by every waiter, for ever; past the bound
    the effect is recorded ``failed`` with code ``too_many_takeovers`` and
    nobody runs it again. ``None`` removes the bound.
    """

    after_ms: int | Unset = UNSET
    max_takeovers: int | Unset | None = UNSET

    def __post_init__(self) -> None:
        _check_int(self.after_ms, "after_ms", maximum=MAX_LEASE_MS)
        _check_int(self.max_takeovers, "max_takeovers", unit="a count", allow_none=True)


#: Where ``run()`` calls a plain (non-async) handler; see ``RunOptions``.
SyncHandlers: TypeAlias = Literal["thread", "loop"]
#: What happens to a run whose holder goes silent for its lease; see ``RunOptions``.
OnStale: TypeAlias = Literal["take_over", "park"]
#: The recovery policies, in the order the docs list them.
ON_STALE_POLICIES: Final = ("take_over", "park")


@_refuse_0_2_seconds
@dataclass(frozen=True, slots=True)
class RunOptions:
    """Per-call (or ledger-default) behaviour of ``run()``; see the module doc.

    ``sync_handlers`` says where a plain (non-async) handler runs:
    ``"thread"`` (the default) runs it in a worker thread, so a blocking
    call inside it cannot stall the event loop, and with it the heartbeats
    that keep the effect from being taken over; ``"loop"`` calls it on the
    event loop, for handlers that must (they should return quickly).

    ``wait_for_approval`` (default True) says what a call does when the
    effect waits for a person: wait (up to ``approval_timeout_ms``), or, when
    False, raise ``ApprovalPendingError`` at once, leaving the effect pending,
    for callers that pause their own way (agent frameworks, web requests).
    It changes only the waiting: an approved effect still runs, a denied one
    still raises ``EffectDeniedError``, a worker's run is still waited for.

    ``retry`` (default None: one try) is the ``RetryPolicy`` the handler's
    failures are retried by; ``None`` set explicitly turns off a policy a
    lower level gave.

    ``timeout_ms`` (default None: no deadline) is the handler's deadline, in
    milliseconds from the start of each try: an async handler still running
    then is cancelled, the effect is recorded with the code
    ``handler_timeout`` and never run again automatically (not by a retry
    policy either: whether its side effect happened is unknown), and the
    caller gets ``HandlerTimeoutError``. A plain handler cannot be
    interrupted: a deadline breach is recorded when it returns. ``run()``
    returns only once the handler has stopped. See ``engine.deadline``.
    ``None`` set explicitly turns off a deadline a lower level gave.

    ``on_stale`` (default ``"take_over"``) says what happens when the worker
    running this call's handler goes silent for its whole lease, so nobody
    knows whether the side effect happened. ``"take_over"``: the next caller
    runs the handler again (right for idempotent tools, and for tools that
    pass ``effect.idem_key`` downstream). ``"park"``: the effect is never run
    again automatically; it waits for a person (``requires_approval``, error
    code ``ambiguous_attempt``), who approves, denies or ``resolve()``s it.
    Under ``"park"`` the run records that its handler starts (one more
    statement, fenced by the attempt) just before calling it, so a run that
    died before that is still taken over. The policy of the run that holds
    the effect decides, never a caller's; see docs/choosing-recovery.md.

    ``retryable`` (default None: every recorded failure is final) names the
    handler failures that a *later call* runs again: exception types, or a
    predicate of the exception (``retries.failure_is_retryable``; a handler
    raising ``RetryableToolError`` is always retryable). Such a failure is
    recorded as the call's outcome, marked retryable on the receipt; the
    next call with the key runs the handler again as a new attempt, exactly
    once however many callers ask (``Store.retry``). ``None`` set explicitly
    turns off what a lower level gave.

    ``principal`` (default None: not said) names who the call runs for: the
    worker, agent or user on whose behalf it asks. When the call's effect is
    sent to a person it is recorded as the approval request's
    ``requested_by`` (shown to approvers; with separation of duty, that
    principal may not decide it). A ledger-wide one goes in
    ``LedgerDefaults(run=RunOptions(principal=...))``.

    ``approval_deadline_ms`` (default None: none) is how long a person has to
    decide the call's approval, from the request, by the store's clock: past
    it the effect is denied with the code ``expired`` by the next
    sweep (``ledger.sweep_approvals()``, ``agent-ledger sweep``) or the
    console reading it, and an approval attempted after it is refused.
    Silence is never consent. It is not ``approval_timeout_ms``, which is
    only how long this caller waits (its effect keeps waiting after it).
    """

    requires_approval: bool | Unset = UNSET
    concurrency: ConcurrencyOptions | Unset | None = UNSET
    stale: StaleOptions | Unset | None = UNSET
    sync_handlers: SyncHandlers | Unset = UNSET
    wait_for_approval: bool | Unset = UNSET
    retry: RetryPolicy | Unset | None = UNSET
    timeout_ms: int | Unset | None = UNSET
    on_stale: OnStale | Unset = UNSET
    retryable: Retryable | Unset | None = UNSET
    principal: str | Unset | None = UNSET
    approval_deadline_ms: int | Unset | None = UNSET

    def __post_init__(self) -> None:
        _check_int(self.timeout_ms, "timeout_ms", allow_none=True, positive=True)
        _check_int(
            self.approval_deadline_ms, "approval_deadline_ms", allow_none=True, positive=True
        )
        if self.principal is not UNSET and self.principal is not None:
            _check_principal(self.principal)
        if self.retryable is not UNSET:
            check_retryable(self.retryable)
        if self.on_stale is not UNSET and self.on_stale not in ON_STALE_POLICIES:
            raise EffectLedgerValidationError(
                f"on_stale must be 'take_over' or 'park', got {self.on_stale!r}",
                field="on_stale",
            )
        for flag in ("requires_approval", "wait_for_approval"):
            value = getattr(self, flag)
            if value is not UNSET and type(value) is not bool:
                raise EffectLedgerValidationError(
                    f"{flag} must be a bool, got {value!r}", field=flag
                )
        if self.sync_handlers not in (UNSET, "thread", "loop"):
            raise EffectLedgerValidationError(
                f"sync_handlers must be 'thread' or 'loop', got {self.sync_handlers!r}",
                field="sync_handlers",
            )
        for name, kind in (
            ("concurrency", ConcurrencyOptions),
            ("stale", StaleOptions),
            ("retry", RetryPolicy),
        ):
            value = getattr(self, name)
            if value is not UNSET and value is not None and not isinstance(value, kind):
                raise EffectLedgerValidationError(
                    f"{name} must be a {kind.__name__} or None, got {value!r}", field=name
                )


@_refuse_0_2_seconds
@dataclass(frozen=True, slots=True)
class LedgerDefaults:
    """Ledger-wide defaults that every ``run()`` starts from."""

    run: RunOptions = RunOptions()


@dataclass(frozen=True, slots=True)
class LedgerHooks:
    """Policy and notification hooks for approvals.

    ``requires_approval(call)`` decides, for fresh calls only, whether the
    call must wait for a human (in addition to ``RunOptions.requires_approval``).
    ``on_approval_required(effect)`` is called once (and awaited, if it is a
    coroutine function), by the caller that moved the effect into
    ``requires_approval``; an exception from it is logged and does not abort
    the run.
    """

    requires_approval: Callable[[ToolCall], bool] | None = None
    #: Sync or async: an awaitable it returns is awaited.
    on_approval_required: Callable[[Effect], Awaitable[None] | None] | None = None
    #: The approval policy's version (say, a git tag or a date): recorded on each
    #: request and part of the intent hash a decision is bound to; an approved
    #: effect claimed under another version goes back to a person. None: unversioned.
    approval_policy_version: str | None = None
    #: Called once per approval request, by the sweep (``ledger.sweep_approvals()``),
    #: when ``escalate_after`` of the time to its deadline has passed and nobody has
    #: decided: page someone else. Sync or async; its failure is logged, never raised.
    on_approval_escalation: Callable[[Effect], Awaitable[None] | None] | None = None
    #: The fraction (0 < f < 1) of a request's time to its deadline after which
    #: ``on_approval_escalation`` fires.
    escalate_after: float = 0.5

    def __post_init__(self) -> None:
        version = self.approval_policy_version
        if version is not None and (not isinstance(version, str) or not version.strip()):
            raise EffectLedgerValidationError(
                f"approval_policy_version must be a non-empty string or None, got {version!r}",
                field="approval_policy_version",
            )
        fraction = self.escalate_after
        if type(fraction) not in (int, float) or not 0 < fraction < 1:
            raise EffectLedgerValidationError(
                f"escalate_after must be a number between 0 and 1 (exclusive), got {fraction!r}",
                field="escalate_after",
            )
        for name in ("requires_approval", "on_approval_required", "on_approval_escalation"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise EffectLedgerValidationError(
                    f"{name} must be a callable or None, got {hook!r}", field=name
                )
        if inspect.iscoroutinefunction(self.requires_approval):
            raise EffectLedgerValidationError(
                "requires_approval must be a plain function returning a bool, not an "
                "async def: it is asked before anything is stored, synchronously",
                field="requires_approval",
            )


@_refuse_0_2_seconds
@dataclass(frozen=True, slots=True)
class EffectLedgerOptions:
    """Everything an ``EffectLedger`` is built from."""

    store: Store
    defaults: LedgerDefaults = LedgerDefaults()
    #: Largest canonical JSON args accepted; ``None`` means 1 MiB.
    max_args_size_bytes: int | None = None
    #: Hooks used when ``run()`` is not given its own.
    hooks: LedgerHooks | None = None
    #: The ledger's own time: when a retry policy's ``timeout_ms`` runs out.
    #: (Stores keep their own clocks; a ``ManualClock`` fits both.)
    clock: Clock = utc_now
    #: How the ledger waits between the tries of a retry policy: an async
    #: function of seconds. Tests pass ``ManualClock.sleep``, which moves the
    #: clock instead of waiting.
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    #: Coming from agent-ledger 0.2.x: before a call is stored, look up its
    #: 0.2.x key among the imported effects (``agent-ledger import-0.2``) and
    #: answer it with the effect found. One extra primary-key read per call;
    #: see docs/migrating-from-0.2.md.
    legacy_keys: bool = False

    def __post_init__(self) -> None:
        if type(self.legacy_keys) is not bool:
            raise EffectLedgerValidationError(
                f"legacy_keys must be a bool, got {self.legacy_keys!r}", field="legacy_keys"
            )
        if self.max_args_size_bytes is not None:
            _check_int(self.max_args_size_bytes, "max_args_size_bytes", unit="bytes", positive=True)
        for name in ("clock", "sleep"):
            if not callable(getattr(self, name)):
                raise EffectLedgerValidationError(
                    f"{name} must be a callable, got {getattr(self, name)!r}", field=name
                )


# --- resolution -------------------------------------------------------------

_Opt = TypeVar("_Opt", ConcurrencyOptions, StaleOptions)

BUILTIN_CONCURRENCY: Final = ConcurrencyOptions(
    wait_timeout_ms=30_000,
    approval_timeout_ms=None,
    initial_interval_ms=50,
    max_interval_ms=1_000,
    backoff_multiplier=1.5,
    jitter_factor=0.3,
)
#: Built-in default for ``StaleOptions.max_takeovers``.
DEFAULT_MAX_TAKEOVERS: Final = 3
BUILTIN_STALE: Final = StaleOptions(
    after_ms=DEFAULT_STALE_AFTER_MS, max_takeovers=DEFAULT_MAX_TAKEOVERS
)


@dataclass(frozen=True, slots=True)
class ResolvedConcurrency:
    wait_timeout_ms: int
    approval_timeout_ms: int | None
    initial_interval_ms: int
    max_interval_ms: int
    backoff_multiplier: float
    jitter_factor: float
    #: The waiter's polling schedule, built once from the four fields above.
    polls: Backoff


@dataclass(frozen=True, slots=True)
class ResolvedRunOptions:
    """Run options with every field decided; what the ledger actually uses."""

    requires_approval: bool
    concurrency: ResolvedConcurrency
    stale_after_ms: int
    #: None: no bound.
    max_takeovers: int | None
    sync_in_thread: bool
    #: The longest a step inside a caller's transaction waits for another
    #: transaction's lock (see ``ConcurrencyOptions``).
    tx_lock_timeout_ms: int
    #: False: raise ``ApprovalPendingError`` instead of waiting for a person.
    wait_for_approval: bool = True
    #: None: one try, no retries.
    retry: RetryPolicy | None = None
    #: The handler's deadline per try, in ms; None: none.
    timeout_ms: int | None = None
    #: What a silent holder's effect becomes: taken over, or parked for a person.
    on_stale: OnStale = "take_over"
    #: Which handler failures a later call runs again; None: all are final.
    retryable: Retryable | None = None
    #: Who the call runs for: an approval request's ``requested_by``; None: not said.
    principal: str | None = None
    #: How long a person has to decide, in ms from the request; None: no deadline.
    approval_deadline_ms: int | None = None


def _overlay(base: _Opt, top: _Opt) -> _Opt:
    """``top``'s set fields over ``base``."""
    changes = {
        f.name: getattr(top, f.name) for f in fields(top) if getattr(top, f.name) is not UNSET
    }
    if not changes:
        return base
    merged = {f.name: getattr(base, f.name) for f in fields(base)} | changes
    return type(base)(**merged)


def merge_run_options(base: RunOptions, top: RunOptions | None) -> RunOptions:
    """``top`` over ``base``, field by field (nested options too).

    Fields neither level set stay unset (``resolve`` fills them), so the
    result still tells what a caller asked for from what is a built-in.
    """
    if top is None:
        return base
    return RunOptions(
        requires_approval=(
            base.requires_approval if top.requires_approval is UNSET else top.requires_approval
        ),
        concurrency=_merge_nested(base.concurrency, top.concurrency),
        stale=_merge_nested(base.stale, top.stale),
        sync_handlers=base.sync_handlers if top.sync_handlers is UNSET else top.sync_handlers,
        wait_for_approval=(
            base.wait_for_approval if top.wait_for_approval is UNSET else top.wait_for_approval
        ),
        # A policy is replaced whole, never merged field by field: its fields
        # only make sense together (attempts with the exceptions they cover).
        retry=base.retry if top.retry is UNSET else top.retry,
        timeout_ms=base.timeout_ms if top.timeout_ms is UNSET else top.timeout_ms,
        on_stale=base.on_stale if top.on_stale is UNSET else top.on_stale,
        retryable=base.retryable if top.retryable is UNSET else top.retryable,
        principal=base.principal if top.principal is UNSET else top.principal,
        approval_deadline_ms=(
            base.approval_deadline_ms
            if top.approval_deadline_ms is UNSET
            else top.approval_deadline_ms
        ),
    )


def _merge_nested(base: _Opt | Unset | None, top: _Opt | Unset | None) -> _Opt | Unset | None:
    """``top`` over ``base``: unset falls through; ``None`` resets to the built-ins."""
    if top is UNSET:
        return base
    if top is None or base is UNSET or base is None:
        return top
    return _overlay(base, top)


def _filled(options: _Opt | Unset | None, builtin: _Opt) -> _Opt:
    """``options`` with every unset field taken from ``builtin``."""
    return builtin if options is UNSET or options is None else _overlay(builtin, options)


def resolve(options: RunOptions) -> ResolvedRunOptions:
    """Fill every unset field from the built-in defaults and check the result."""
    concurrency = _filled(options.concurrency, BUILTIN_CONCURRENCY)
    stale = _filled(options.stale, BUILTIN_STALE)
    # Each level was valid alone; the merge can still pair a large initial
    # interval from one level with a small maximum from another.
    _check_interval_order(concurrency.initial_interval_ms, concurrency.max_interval_ms)
    settings = {f.name: getattr(concurrency, f.name) for f in fields(concurrency)}
    polls = Backoff(
        initial_s=settings["initial_interval_ms"] / 1000.0,
        multiplier=settings["backoff_multiplier"],
        max_s=settings["max_interval_ms"] / 1000.0,
        jitter=settings["jitter_factor"],
    )
    c = ResolvedConcurrency(**settings, polls=polls)
    assert stale.after_ms is not UNSET
    assert stale.max_takeovers is not UNSET
    # Only a wait_timeout_ms someone set bounds lock waits inside a transaction;
    # the built-in 30 s would hold the caller's own locks that long.
    asked = options.concurrency
    tx_lock_timeout_ms = (
        asked.wait_timeout_ms
        if isinstance(asked, ConcurrencyOptions) and asked.wait_timeout_ms is not UNSET
        else DEFAULT_TX_LOCK_TIMEOUT_MS
    )
    return ResolvedRunOptions(
        requires_approval=(
            False if options.requires_approval is UNSET else options.requires_approval
        ),
        concurrency=c,
        stale_after_ms=stale.after_ms,
        max_takeovers=stale.max_takeovers,
        sync_in_thread=options.sync_handlers != "loop",
        tx_lock_timeout_ms=tx_lock_timeout_ms,
        wait_for_approval=options.wait_for_approval is not False,
        retry=None if options.retry is UNSET else options.retry,
        timeout_ms=None if options.timeout_ms is UNSET else options.timeout_ms,
        on_stale="take_over" if options.on_stale is UNSET else options.on_stale,
        retryable=None if options.retryable is UNSET else options.retryable,
        principal=None if options.principal is UNSET else options.principal,
        approval_deadline_ms=(
            None if options.approval_deadline_ms is UNSET else options.approval_deadline_ms
        ),
    )


def _check_principal(value: object) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > _MAX_PRINCIPAL:
        raise EffectLedgerValidationError(
            f"principal must be a non-empty string of at most {_MAX_PRINCIPAL} characters "
            f"(who the call runs for), got {value!r}",
            field="principal",
        )


#: The longest principal a request records.
_MAX_PRINCIPAL: Final = 255
