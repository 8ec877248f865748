"""The effect record and the values that flow in and out of ``begin``/``commit``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Generic, Literal, NamedTuple, TypeAlias, TypeGuard, TypeVar, cast

import orjson

from agent_ledger.codes import ErrorCode
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.fields import EFFECT_FIELDS
from agent_ledger.status import TRANSITIONS, EffectStatus

#: Any value JSON can represent. Args and results must be of this shape.
JSONValue: TypeAlias = (
    "bool | int | float | str | list[JSONValue] | tuple[JSONValue, ...] "
    "| dict[str, JSONValue] | None"
)

T = TypeVar("T")


def storable_text(text: str) -> str:
    """``text`` with what no store can keep (NUL, lone surrogates) replaced by U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    return text


@dataclass(frozen=True, slots=True)
class EffectError:
    """Why an effect failed, was denied or was canceled.

    ``code`` is machine-readable: the exception's ``code`` attribute or class
    name for handler failures, an ``agent_ledger.codes.ErrorCode`` for what the
    ledger records itself (``denied`` and ``canceled`` for decisions, ...).
    """

    message: str
    code: str | None = None

    def __post_init__(self) -> None:
        # Errors are diagnostics: make any text storable rather than fail to
        # record a failure. NUL and lone surrogates become U+FFFD.
        object.__setattr__(self, "message", storable_text(str(self.message)))
        if self.code is not None:
            object.__setattr__(self, "code", storable_text(str(self.code)))

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}" if self.code else self.message


#: The most tokens one ``Usage`` may count in each direction, and the most dollars
#: it may cost: far beyond any real call, and small enough that the sums of
#: many thousands of calls still fit the 64-bit counters budgets keep (dollars
#: in millionths), and every JSON encoder writes them exactly.
MAX_USAGE_TOKENS: Final = 10**15
MAX_USAGE_COST_USD: Final = 1e9


def is_usd_amount(value: object) -> TypeGuard[float]:
    """``value`` is a dollar amount a ``Usage`` may hold: an int or float (not a
    bool), finite, from 0 to ``MAX_USAGE_COST_USD``."""
    if type(value) not in (int, float):
        return False
    amount = cast(float, value)
    return math.isfinite(amount) and 0 <= amount <= MAX_USAGE_COST_USD


@dataclass(frozen=True, slots=True)
class Usage:
    """What one model call consumed, as recorded on its effect (``Effect.usage``).

    Token counts come from the provider's own response (the adapters read
    them from the SDKs' objects); ``cost_usd`` is what the pricing callback
    given to ``ledger.llm(..., pricing=...)`` made of them, or None when no
    price was known. Budgets are booked from this record, never from memory,
    so a replay or another worker sees the same spend.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_USAGE_TOKENS:
                raise EffectLedgerValidationError(
                    f"Usage.{name} must be an int from 0 to {MAX_USAGE_TOKENS:_} (a token "
                    f"count), got {value!r}",
                    field=name,
                )
        cost = self.cost_usd
        if cost is not None:
            if not is_usd_amount(cost):
                raise EffectLedgerValidationError(
                    f"Usage.cost_usd must be a finite number of US dollars from 0 to "
                    f"{MAX_USAGE_COST_USD:_} or None, got {cost!r}",
                    field="cost_usd",
                )
            object.__setattr__(self, "cost_usd", float(cost))

    def __add__(self, other: Usage) -> Usage:
        """Both calls' tokens and dollars (a cost unknown on either side stays unknown)."""
        if not isinstance(other, Usage):
            return NotImplemented
        cost = (
            None
            if self.cost_usd is None or other.cost_usd is None
            else min(self.cost_usd + other.cost_usd, MAX_USAGE_COST_USD)
        )
        return Usage(
            min(self.input_tokens + other.input_tokens, MAX_USAGE_TOKENS),
            min(self.output_tokens + other.output_tokens, MAX_USAGE_TOKENS),
            cost,
        )

    def to_json(self) -> dict[str, JSONValue]:
        """The stored (and exported) form: a JSON object with the three fields."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
        }

    @classmethod
    def from_json(cls, value: object) -> Usage:
        """The inverse of :meth:`to_json` (a stored or exported usage object)."""
        if not isinstance(value, dict):
            raise EffectLedgerValidationError(
                f"usage must be a JSON object, got {value!r}", field="usage"
            )
        return cls(
            input_tokens=value.get("input_tokens", 0),
            output_tokens=value.get("output_tokens", 0),
            cost_usd=value.get("cost_usd"),
        )


def usage_from_json(text: str | None) -> Usage | None:
    """A stored ``usage`` column (JSON text, or NULL) as a ``Usage``."""
    return None if text is None else Usage.from_json(orjson.loads(text))


def usage_to_json(usage: Usage | None) -> str | None:
    """The text a store keeps in its ``usage`` column."""
    return None if usage is None else orjson.dumps(usage.to_json()).decode()


@dataclass(frozen=True, slots=True)
class TryFailure:
    """One try of a retried handler that failed, as recorded before the next one.

    Kept in ``Effect.history`` in the order the tries ran; the last try of a
    run whose tries ran out is there too (its outcome, ``retries_exhausted``,
    is the effect's ``error``).
    """

    #: Which try it was: 1 for the first, counted over the effect's current
    #: run (a reopened effect starts again at 1).
    number: int
    #: The fencing token of the claim it ran under (a takeover's tries have a later one).
    attempt: int
    #: The exception's message, ``code`` (or class name) and qualified class name.
    message: str
    code: str | None
    type: str
    #: When it was recorded, by the store's clock.
    at: datetime


@dataclass(frozen=True, slots=True)
class Reopening:
    """An operator's ``reopen()``: the effect as it ended before it was sent back to ``ready``."""

    #: ``failed`` or ``canceled``: how it had ended.
    status: EffectStatus
    #: Why it had ended, as it was recorded (the reason, for a cancellation).
    error: EffectError | None
    #: How many tries its run had used.
    tries: int
    #: Who reopened it, and why (both required).
    by: str
    reason: str
    #: When, by the store's clock; also the effect's ``decided_at`` until a later decision.
    at: datetime


@dataclass(frozen=True, slots=True)
class Parked:
    """A run under ``on_stale="park"`` whose holder went silent after its handler
    started: the effect was sent to a person instead of being taken over."""

    #: The attempt whose handler may or may not have done its side effect.
    attempt: int
    #: When that attempt's handler was handed the effect, and who ran it
    #: (``host:pid`` by default), as its run recorded them.
    started_at: datetime | None
    worker: str | None
    #: The holder's last sign of life, by the store's clock.
    heartbeat_at: datetime
    #: When it was parked, by the store's clock.
    at: datetime


@dataclass(frozen=True, slots=True)
class Settlement:
    """A person's decision on an effect waiting for one: ``approve`` (``ready``),
    ``deny`` (``denied``) or ``resolve`` (``succeeded``/``failed``)."""

    #: The status the decision moved the effect to.
    status: EffectStatus
    #: The attempt the decision was made on (the one the person saw).
    attempt: int
    by: str | None
    note: str | None
    #: When, by the store's clock; also the effect's ``decided_at`` until a later decision.
    at: datetime


@dataclass(frozen=True, slots=True)
class Scoped:
    """The turn and tool-call id a new effect was created in, and the scope it was
    keyed by: the first event of an effect created inside a turn (or with a
    scope other than ``"workflow"``). Written with the insert, so it has no
    time of its own: the effect's ``created_at`` is when.

    Effects created outside any turn with ``scope="workflow"`` (and every
    effect of earlier releases) have none.
    """

    #: ``"workflow"``, ``"turn"`` or ``"call"``: what, besides the args, keyed it.
    scope: str
    #: The turn it was created in (``ledger.workflow(id, turn=...)``), if any.
    turn: str | None
    #: The framework's tool-call id that created it, if any (also ``Effect.call_id``).
    call_id: str | None


@dataclass(frozen=True, slots=True)
class RetryableFailure:
    """A failure the tool declared retryable (``retryable=``, or the handler raised
    ``RetryableToolError``), recorded with the outcome that ended ``attempt``.

    While it is the effect's last event and the effect is still ``failed`` at
    that attempt, the next call with the key runs the handler again as a new
    attempt (``Store.retry``); the event stays in the history after that, so
    every earlier failure is kept.
    """

    #: The attempt whose run ended with this failure.
    attempt: int
    message: str
    code: str | None
    #: When it was recorded, by the store's clock.
    at: datetime


#: What ``Effect.history`` holds, oldest first.
HistoryEvent: TypeAlias = TryFailure | Reopening | Parked | Settlement | Scoped | RetryableFailure

#: The ``kind`` of each event in the stored JSON.
TRY_FAILED: Final = "try_failed"
REOPENED: Final = "reopened"
PARKED: Final = "parked"
SETTLED: Final = "settled"
SCOPED: Final = "scoped"
RETRYABLE_FAILURE: Final = "retryable_failure"


def scoped_history(scope: str, turn: str | None, call_id: str | None) -> str:
    """The history a new effect is inserted with: ``"[]"``, or its :class:`Scoped` event
    (when it has a turn or a scope other than ``"workflow"``)."""
    if turn is None and scope == "workflow":
        return "[]"
    event = {"kind": SCOPED, "scope": scope, "turn": turn, "call_id": call_id}
    return orjson.dumps([event]).decode()


def history_from_json(text: str | None) -> tuple[HistoryEvent, ...]:
    """The events of a stored ``history`` (a JSON array, as every store keeps it)."""
    if not text or text == "[]":
        return ()
    return tuple(event_from_dict(item) for item in orjson.loads(text))


def _moment(text: str) -> datetime:
    at = datetime.fromisoformat(text)
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def event_from_dict(item: dict[str, Any]) -> HistoryEvent:
    """One event from its JSON object (see :func:`event_to_dict`)."""
    if item["kind"] == SCOPED:
        return Scoped(
            scope=str(item["scope"]),
            turn=_text_or_none(item.get("turn")),
            call_id=_text_or_none(item.get("call_id")),
        )
    at = _moment(item["at"])
    if item["kind"] == RETRYABLE_FAILURE:
        return RetryableFailure(
            attempt=int(item["attempt"]),
            message=str(item["message"]),
            code=_text_or_none(item.get("code")),
            at=at,
        )
    if item["kind"] == PARKED:
        started = item.get("started_at")
        return Parked(
            attempt=int(item["attempt"]),
            started_at=None if started is None else _moment(started),
            worker=_text_or_none(item.get("worker")),
            heartbeat_at=_moment(item["heartbeat_at"]),
            at=at,
        )
    if item["kind"] == SETTLED:
        return Settlement(
            status=EffectStatus(item["status"]),
            attempt=int(item["attempt"]),
            by=_text_or_none(item.get("by")),
            note=_text_or_none(item.get("note")),
            at=at,
        )
    if item["kind"] == TRY_FAILED:
        return TryFailure(
            number=int(item["try"]),
            attempt=int(item["attempt"]),
            message=str(item["message"]),
            code=None if item.get("code") is None else str(item["code"]),
            type=str(item["type"]),
            at=at,
        )
    if item["kind"] == REOPENED:
        error = item.get("error")
        return Reopening(
            status=EffectStatus(item["status"]),
            error=None if error is None else EffectError(error["message"], error.get("code")),
            tries=int(item["tries"]),
            by=str(item["by"]),
            reason=str(item["reason"]),
            at=at,
        )
    raise ValueError(f"unknown history event kind {item.get('kind')!r}")


def event_to_dict(event: HistoryEvent) -> dict[str, JSONValue]:
    """The JSON object an event is stored (and exported) as; ``at`` in ISO 8601."""
    if isinstance(event, TryFailure):
        return {
            "kind": TRY_FAILED,
            "try": event.number,
            "attempt": event.attempt,
            "message": event.message,
            "code": event.code,
            "type": event.type,
            "at": event.at.isoformat(),
        }
    if isinstance(event, Parked):
        return {
            "kind": PARKED,
            "attempt": event.attempt,
            "started_at": None if event.started_at is None else event.started_at.isoformat(),
            "worker": event.worker,
            "heartbeat_at": event.heartbeat_at.isoformat(),
            "at": event.at.isoformat(),
        }
    if isinstance(event, Scoped):
        return {
            "kind": SCOPED,
            "scope": event.scope,
            "turn": event.turn,
            "call_id": event.call_id,
        }
    if isinstance(event, RetryableFailure):
        return {
            "kind": RETRYABLE_FAILURE,
            "attempt": event.attempt,
            "message": event.message,
            "code": event.code,
            "at": event.at.isoformat(),
        }
    if isinstance(event, Settlement):
        return {
            "kind": SETTLED,
            "status": event.status.value,
            "attempt": event.attempt,
            "by": event.by,
            "note": event.note,
            "at": event.at.isoformat(),
        }
    error = event.error
    return {
        "kind": REOPENED,
        "status": event.status.value,
        "error": None if error is None else {"message": error.message, "code": error.code},
        "tries": event.tries,
        "by": event.by,
        "reason": event.reason,
        "at": event.at.isoformat(),
    }


@dataclass(frozen=True, slots=True)
class Effect:
    """One tool call's receipt, as the store holds it.

    Datetimes are timezone-aware UTC and come from the store's clock.
    ``updated_at`` moves on status changes only; a duplicate call bumps
    ``dedup_count`` and nothing else. A handler reads the call's args as
    ``effect.args`` (and its resource as ``effect.resource``), so it needs no
    closure over the ``ToolCall``.
    """

    # The decoded views of the canonical texts; the fields follow.

    @property
    def args(self) -> dict[str, JSONValue]:
        """The call's args, decoded from ``args_canonical``.

        A new dict on every access: a handler may change what it got without
        changing the receipt, or what anyone else reads from it. Tuples in the
        call come back as lists (the args are kept as JSON).
        """
        args: dict[str, JSONValue] = orjson.loads(self.args_canonical)
        return args

    @property
    def resource(self) -> dict[str, JSONValue] | None:
        """The call's resource as ``{"id": {...}, "namespace": ..., "type": ...}``, decoded
        from ``resource_id_canonical``, or None when the call named none.

        A new dict on every access, like :attr:`args`.
        """
        if self.resource_id_canonical is None:
            return None
        resource: dict[str, JSONValue] = orjson.loads(self.resource_id_canonical)
        return resource

    #: Store-assigned unique id (a UUID string).
    id: str
    #: SHA-256 hex of the call's identity; see ``agent_ledger.keys``.
    idem_key: str
    workflow_id: str
    #: The caller's own id for this invocation (e.g. an LLM tool-call id). Not part of the key.
    call_id: str | None
    tool: str
    status: EffectStatus
    #: The call's args as canonical JSON text (sorted keys, compact).
    args_canonical: str
    #: The resource descriptor as canonical JSON text, when the call had one.
    resource_id_canonical: str | None
    #: The handler's return value, decoded from the stored JSON. ``None`` until succeeded.
    result: JSONValue
    error: EffectError | None
    #: How many calls after the first asked for this same effect (outside a
    #: transaction: a ``tx=`` call only reads an existing effect, see ``Store.begin``).
    dedup_count: int
    #: Fencing token: incremented by every claim (fresh, ready -> processing,
    #: takeover) and by an approval-gated insert. Not a count of runs: see ``executions``.
    attempt: int
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    #: Last sign of life from the worker holding the current attempt.
    heartbeat_at: datetime
    #: Who approved, denied or canceled the effect (as given to the ledger), if anyone.
    decided_by: str | None = None
    #: The approver's note (a denial's or cancellation's reason is ``error.message``).
    decision_note: str | None = None
    #: When that decision was recorded.
    decided_at: datetime | None = None
    #: When the last execution started (the claim that handed it to a handler);
    #: None if no handler ever ran. ``completed_at - started_at`` is the run,
    #: apart from any wait for approval.
    started_at: datetime | None = None
    #: How many times a handler was started for this effect: 1 normally, more
    #: after takeovers, 0 while it waits for approval or if it was denied.
    executions: int = 0
    #: The current holder's lease in ms (its stale window, recorded when it
    #: claimed the effect): another caller may take the effect over only
    #: after this long without a heartbeat. 0: never.
    lease_ms: int = 0
    #: How many tries of the handler ended in the current run: each failed try
    #: a retry policy recorded, plus the one whose outcome was committed. 1
    #: for a run without retries; 0 before any try ended. A worker that takes
    #: the effect over continues from here; ``reopen()`` starts it again at 0.
    tries: int = 0
    #: What happened before the outcome, oldest first: each failed try of a
    #: retried handler (``TryFailure``), each ``reopen()`` (``Reopening``),
    #: each park of an ambiguous attempt (``Parked``) and each person's
    #: approve, deny or resolve (``Settlement``); first, the turn and scope it
    #: was created in (``Scoped``), and each failure declared retryable
    #: (``RetryableFailure``), which the next call runs again after.
    history: tuple[HistoryEvent, ...] = ()
    #: What a model call consumed (tokens, and its price), recorded with its
    #: outcome by ``ledger.llm()``; None for every other effect.
    usage: Usage | None = None
    #: The attempt whose handler a run under ``on_stale="park"`` recorded as
    #: started, just before calling it: should that attempt's holder go
    #: silent, the effect is parked for a person instead of taken over. None
    #: when no such run started (``take_over`` runs never record it).
    park_attempt: int | None = None
    #: Who ran that handler (``host:pid`` by default), as its run recorded it.
    worker: str | None = None

    @property
    def parked(self) -> bool:
        """Waiting for a person because an attempt's outcome is unknown (``ambiguous_attempt``)."""
        return (
            self.status is EffectStatus.REQUIRES_APPROVAL
            and self.error is not None
            and self.error.code == ErrorCode.AMBIGUOUS_ATTEMPT
        )

    @property
    def scoped(self) -> Scoped | None:
        """The turn, tool-call id and scope it was created with (its first event), if recorded."""
        history = self.history
        if history and isinstance(history[0], Scoped):
            return history[0]
        return None

    @property
    def turn(self) -> str | None:
        """The turn it was created in (``ledger.workflow(id, turn=...)``), or None."""
        scoped = self.scoped
        return None if scoped is None else scoped.turn

    @property
    def scope(self) -> str:
        """What keyed it besides its args: ``"workflow"``, ``"turn"`` or ``"call"``."""
        scoped = self.scoped
        return "workflow" if scoped is None else scoped.scope

    @property
    def retryable(self) -> bool:
        """Failed with a failure its tool declared retryable: the next call with its key
        runs the handler again (a new attempt) instead of replaying the failure."""
        if self.status is not EffectStatus.FAILED or not self.history:
            return False
        last = self.history[-1]
        return isinstance(last, RetryableFailure) and last.attempt == self.attempt


class _Unfrozen:
    """``Effect``'s slots, settable: what :func:`effect_from_values` fills in.

    A frozen dataclass sets each field in ``__init__`` through
    ``object.__setattr__``, a call per field (27 of them, on every read of an
    effect). This class has the same slot layout without the freezing: its
    slots are filled by plain stores, then the instance becomes an ``Effect``
    (``__class__`` assignment, which Python allows between classes of the
    same layout). The result is an ordinary ``Effect``, equal to
    ``Effect(*values)``; a test holds the two equal field by field.
    """

    __slots__ = EFFECT_FIELDS


def effect_from_values(values: Sequence[Any]) -> Effect:
    """``Effect(*values)``, values in ``EFFECT_FIELDS`` order, at about a quarter of its cost."""
    e: Any = _Unfrozen()
    (e.id, e.idem_key, e.workflow_id, e.call_id, e.tool, e.status, e.args_canonical,
     e.resource_id_canonical, e.result, e.error, e.dedup_count, e.attempt, e.created_at,
     e.updated_at, e.completed_at, e.heartbeat_at, e.decided_by, e.decision_note, e.decided_at,
     e.started_at, e.executions, e.lease_ms, e.tries, e.history, e.usage, e.park_attempt,
     e.worker) = values  # fmt: skip
    e.__class__ = Effect
    built: Effect = e
    return built


def effect_from_fields(source: Any, result: JSONValue) -> Effect:
    """An ``Effect`` of ``result`` and every other field read from ``source``'s
    attribute of the same name (MemoryStore's row): :func:`effect_from_values`
    without the tuple of values in between, for a store whose row object has
    the fields as attributes."""
    e: Any = _Unfrozen()
    s = source
    (e.id, e.idem_key, e.workflow_id, e.call_id, e.tool, e.status, e.args_canonical,
     e.resource_id_canonical, e.result, e.error, e.dedup_count, e.attempt, e.created_at,
     e.updated_at, e.completed_at, e.heartbeat_at, e.decided_by, e.decision_note, e.decided_at,
     e.started_at, e.executions, e.lease_ms, e.tries, e.history, e.usage, e.park_attempt,
     e.worker) = (
        s.id, s.idem_key, s.workflow_id, s.call_id, s.tool, s.status, s.args_canonical,
        s.resource_id_canonical, result, s.error, s.dedup_count, s.attempt, s.created_at,
        s.updated_at, s.completed_at, s.heartbeat_at, s.decided_by, s.decision_note, s.decided_at,
        s.started_at, s.executions, s.lease_ms, s.tries, s.history, s.usage, s.park_attempt,
        s.worker,
    )  # fmt: skip
    e.__class__ = Effect
    built: Effect = e
    return built


#: The statuses a run ends in (from ``processing``, the terminal ones): their
#: ``completed_at`` is when the run's outcome (or a cancel during it) was recorded.
RUN_ENDS: Final = frozenset(s for s in TRANSITIONS[EffectStatus.PROCESSING] if s.is_terminal)


def handler_time(effect: Effect, now: datetime) -> timedelta | None:
    """How long the effect's current run has taken: its *handler time*.

    From ``started_at`` (the claim that handed the effect to a handler) to
    ``completed_at`` (its recorded outcome), or to ``now`` (the store's
    clock) while it is ``processing``. Time spent waiting for a person is
    never counted: a run starts after its approval. Waits between the tries
    of a retry policy are (they are one run). None when no run's end is
    known: no handler ever ran (waiting for approval, ready, denied), or a
    person decided after the run started (a ``cancel()`` mid-run, which
    does not tell when the handler stopped; a ``reopen()`` whose new run has
    not started). Every store's duration filter is this function, in SQL.
    """
    started = effect.started_at
    if started is None or (effect.decided_at is not None and effect.decided_at > started):
        return None
    if effect.status is EffectStatus.PROCESSING:
        return now - started
    if effect.status in RUN_ENDS and effect.completed_at is not None:
        return effect.completed_at - started
    return None


#: Built-in default for ``StaleOptions.after_ms``, the lease an effect's holder
#: gets (see ``StaleOptions``). Here, beside ``NewEffect``, which records it:
#: ``agent_ledger.options`` hands it on.
DEFAULT_STALE_AFTER_MS: Final = 15_000


class NewEffect(NamedTuple):
    """What ``begin`` inserts when the key is new."""

    idem_key: str
    workflow_id: str
    call_id: str | None
    tool: str
    args_canonical: str
    resource_id_canonical: str | None
    #: Insert it waiting for a person (``requires_approval``) instead of
    #: ``processing``: one atomic step, so no crash, error or cancellation
    #: between two steps can leave an approval-gated effect claimable.
    requires_approval: bool = False
    #: The creator's lease in ms (its stale window; 0: never taken over),
    #: recorded with the effect so that others judge staleness by it.
    lease_ms: int = DEFAULT_STALE_AFTER_MS
    #: The history it starts with, as JSON text: ``"[]"``, or its turn and
    #: scope (:func:`scoped_history`).
    history: str = "[]"


@dataclass(frozen=True, slots=True)
class BeginResult(Generic[T]):
    """What ``begin()`` found.

    ``cached`` is True when the effect already has a successful outcome:
    ``cached_result`` holds it and the caller must not run the tool. When
    ``cached`` is False the caller owns ``effect`` (its status is
    ``processing`` and ``effect.attempt`` is the caller's fencing token): run
    the tool, then ``commit()``. ``idempotency_status`` is ``"fresh"`` when
    this call created the effect and ``"replayed"`` when it already existed
    (including a takeover or an approved effect the caller now owns).
    """

    effect: Effect
    cached: bool
    idempotency_status: Literal["fresh", "replayed"]
    cached_result: T | None = None


@dataclass(frozen=True, slots=True)
class CommitSucceeded:
    """Outcome for ``commit()``: the tool succeeded with ``result`` (must be JSON).

    ``usage``, for a model call, is recorded with it in the same statement.
    """

    result: JSONValue = field(default=None)
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class WithUsage:
    """What a handler returns to have ``usage`` recorded with its ``result``.

    ``ledger.run()`` records both in the one statement that records the
    outcome (so a receipt never has a result without its usage) and returns
    ``result``. ``ledger.llm()`` builds it; other handlers rarely need to.
    """

    result: object
    usage: Usage


class FailedWithUsage(Exception):
    """What a handler raises when its call was paid for but cannot end well.

    A model call whose answer came back but cannot be recorded (the response
    is not JSON, ``read=`` or the pricing callback raised) still cost money:
    ``ledger.run()`` records the failure of ``cause`` together with ``usage``
    in the one statement that records the outcome, so the receipt (and the
    budget booked from it) keeps what the call consumed, then raises
    ``cause``. Never retried by a retry policy: a retry would pay again.
    """

    def __init__(self, cause: Exception, usage: Usage) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.usage = usage


@dataclass(frozen=True, slots=True)
class CommitFailed:
    """Outcome for ``commit()``: the tool failed with ``error``.

    ``retryable``: the failure may be run again by a later call with the key
    (the next ``begin()`` or ``run()`` gets the effect to execute, as a new
    attempt); False (the default): the failure is final.
    """

    error: EffectError
    retryable: bool = False


CommitOutcome: TypeAlias = CommitSucceeded | CommitFailed
