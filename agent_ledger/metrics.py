"""OpenTelemetry metrics: what the ledger did, counted, beside the spans.

Every instrument, its unit and its attributes are in one table, :data:`INSTRUMENTS`,
and in docs/guide.md (Observability). The engine, the decision steps and the
sweeps call the small functions below at the moment a transition is theirs
(their compare-and-set won), so each event is counted once, by the process
that made it happen.

Cost, in three cases:

* ``opentelemetry-api`` not installed: this module tries the import once, when
  ``agent_ledger`` is imported, and every function below returns at its first
  line (a global read). Nothing else is imported, ever.
* The API installed, no meter provider set (the Anthropic and MCP SDKs install
  it): each function reads the API's provider global (one attribute read; not
  ``get_meter_provider()``, which also looks up an environment variable on
  every call) and returns. No attribute dict is built, no instrument exists.
* A provider set (``metrics.set_meter_provider``, before or after this module
  was imported; or :func:`set_meter_provider` here): the instruments are
  created on the first event. The counters are observable instruments: an
  event adds one to a running total here (a dict update under a lock, about
  a fifth of a microsecond), and the SDK reads the totals when it collects;
  an SDK ``Counter.add`` would cost microseconds per event. The wait
  histogram, one record per decision, is an ordinary SDK histogram.

The attributes are low-cardinality on purpose: the tool name, and for
decisions the channel, the action and the reason code. Never an idempotency
key, a workflow id, an effect id or arguments: one series per key would grow
without bound. Tool names are your code's registered tools; if yours are
generated per call, drop ``agent_ledger.tool`` with an SDK ``View``.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from agent_ledger._version import __version__
from agent_ledger.codes import ErrorCode
from agent_ledger.status import EffectStatus

if TYPE_CHECKING:
    from agent_ledger.approvals import Channel, DecisionAction
    from agent_ledger.codes import DecisionCode
    from agent_ledger.effects import Effect

__all__ = [
    "ATTRIBUTES",
    "EXPIRED",
    "INSTRUMENTS",
    "OUTCOMES",
    "WAIT_BUCKETS_S",
    "Instrument",
    "approval_entered",
    "approval_left",
    "commit_fenced",
    "decided",
    "executed",
    "recording",
    "refused",
    "replayed",
    "set_meter_provider",
    "taken_over",
]

#: The attribute keys the instruments use, and what each one holds.
TOOL: Final = "agent_ledger.tool"
CHANNEL: Final = "agent_ledger.decision.channel"
ACTION: Final = "agent_ledger.decision.action"
REASON: Final = "agent_ledger.decision.reason"
OUTCOME: Final = "agent_ledger.approval.outcome"

ATTRIBUTES: Final[Mapping[str, str]] = MappingProxyType(
    {
        TOOL: "the effect's tool name (`ToolCall.tool`, a registered tool's name)",
        CHANNEL: "where a decision came from: `console`, `link`, `slack`, `cli` or `code`",
        ACTION: "what the person asked: `approve`, `deny` or `resolve`",
        REASON: "why it was refused: a `DecisionCode` other than `decided`",
        OUTCOME: (
            "how the wait ended: `approved`, `denied`, `resolved`, `canceled` "
            "or `expired` (the deadline passed)"
        ),
    }
)


class Instrument(NamedTuple):
    """One instrument of :data:`INSTRUMENTS`."""

    name: str
    kind: str
    unit: str
    attributes: tuple[str, ...]
    description: str


#: Approval waits are minutes to days: buckets from a second to a week.
WAIT_BUCKETS_S: Final = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    28800.0,
    86400.0,
    172800.0,
    604800.0,
)

_EXECUTIONS: Final = Instrument(
    "agent_ledger.executions",
    "counter",
    "{execution}",
    (TOOL,),
    "Handler starts: each try of a handler `run()` calls (a retry policy's tries "
    "included), and each `begin()` that hands its caller an effect to run.",
)
_REPLAYS: Final = Instrument(
    "agent_ledger.replays",
    "counter",
    "{replay}",
    (TOOL,),
    "Calls answered with an outcome recorded by another call, without running the "
    "handler: the key was stored already (finished, or finished while this call waited).",
)
_TAKEOVERS: Final = Instrument(
    "agent_ledger.takeovers",
    "counter",
    "{takeover}",
    (TOOL,),
    "Claims of an effect whose holder stopped heartbeating for its lease "
    "(`processing` -> `processing`, attempt + 1), by a waiting caller or a saga's rollback.",
)
_FENCED: Final = Instrument(
    "agent_ledger.fenced_commits",
    "counter",
    "{commit}",
    (TOOL,),
    "Outcomes the store refused because their attempt no longer held the effect: taken "
    "over meanwhile, or canceled or parked for a person; the other outcome stands.",
)
_DECISIONS: Final = Instrument(
    "agent_ledger.decisions",
    "counter",
    "{decision}",
    (TOOL, CHANNEL, ACTION),
    "Accepted decisions: a person's approve, deny or resolve that made the transition.",
)
_REFUSED: Final = Instrument(
    "agent_ledger.refused_decisions",
    "counter",
    "{decision}",
    (CHANNEL, ACTION, REASON),
    "Decision attempts refused (already decided, intent changed, expired, not allowed, "
    "a used or invalid link...): each is a refused row of the decision audit trail.",
)
_WAIT: Final = Instrument(
    "agent_ledger.approval.wait.duration",
    "histogram",
    "s",
    (TOOL, OUTCOME),
    "How long an effect waited for a person: from entering `requires_approval` to "
    "leaving it, by the store's clock.",
)
_PENDING: Final = Instrument(
    "agent_ledger.approval.pending",
    "updowncounter",
    "{effect}",
    (TOOL,),
    "Effects this process sent to a person (+1) minus those it took out of "
    "`requires_approval` (-1). Per process: the sum over every process sharing a store "
    "is the number waiting (see docs/guide.md).",
)

#: Every instrument the ledger records, in the order the docs list them.
INSTRUMENTS: Final[tuple[Instrument, ...]] = (
    _EXECUTIONS,
    _REPLAYS,
    _TAKEOVERS,
    _FENCED,
    _DECISIONS,
    _REFUSED,
    _WAIT,
    _PENDING,
)


def _load(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


#: ``opentelemetry.metrics``, None when the API is not installed.
_api: Any = _load("opentelemetry.metrics")
#: Where the API keeps the global provider; its getter also reads an
#: environment variable on every call, so the hot path reads the global.
_globals: Any = _load("opentelemetry.metrics._internal") if _api is not None else None
if _globals is not None and not hasattr(_globals, "_METER_PROVIDER"):
    _globals = None  # another API layout: fall back to get_meter_provider()
if _api is not None:
    # Once, now: a provider named by OTEL_PYTHON_METER_PROVIDER is loaded and set.
    _api.get_meter_provider()


class _Totals:
    """Running totals of one counter, by its attributes' values: an event adds to a
    dict entry (under a lock: sync callers run loops on other threads), and the
    SDK reads the totals when it collects (an observable instrument's callback).
    An SDK ``Counter.add`` costs microseconds per event (attribute checks, an
    exemplar sample, a hash); this costs a dict update."""

    __slots__ = ("_keys", "_lock", "_totals")

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = keys
        self._lock = threading.Lock()
        self._totals: dict[tuple[str, ...], int] = {}

    def add(self, values: tuple[str, ...], amount: int = 1) -> None:
        with self._lock:
            self._totals[values] = self._totals.get(values, 0) + amount

    def observe(self, _options: object) -> list[Any]:
        """The callback: one observation per series seen (zeros included)."""
        with self._lock:
            totals = list(self._totals.items())
        observation, keys = _api.Observation, self._keys
        return [observation(n, dict(zip(keys, values, strict=True))) for values, n in totals]


class _Bound(NamedTuple):
    """The instruments, created on one provider, and the totals they report."""

    provider: object
    executions: _Totals
    replays: _Totals
    takeovers: _Totals
    fenced: _Totals
    decisions: _Totals
    refused: _Totals
    pending: _Totals
    #: The histogram: an SDK instrument (one record per decision, not per call).
    wait: Any


#: The instruments, once a provider records (None: not yet, or nothing to record on).
_bound: _Bound | None = None
#: A provider given to :func:`set_meter_provider`; None: the API's global one.
_chosen: object | None = None
#: Every binding made, by provider (a handful at most: the global one, and those
#: given to :func:`set_meter_provider`).
_earlier: list[_Bound] = []
_lock = threading.Lock()


def _instruments() -> _Bound | None:
    """The instruments, or None while nothing would record them (the hot path)."""
    bound = _bound
    if bound is not None:
        return bound
    if _api is None:
        return None
    provider = _chosen
    if provider is None:
        provider = _globals._METER_PROVIDER if _globals is not None else _global_provider()
        if provider is None or isinstance(provider, _api.NoOpMeterProvider):
            return None
    return _bind(provider)


def _global_provider() -> object | None:
    provider = _api.get_meter_provider()
    # The proxy handed out until a provider is set records nothing.
    return None if type(provider).__name__ == "_ProxyMeterProvider" else provider


def _bind(provider: Any) -> _Bound:
    global _bound
    with _lock:
        if _bound is not None and _bound.provider is provider:
            return _bound
        for earlier in _earlier:
            if earlier.provider is provider:
                # Back to a provider used before: its instruments exist (creating
                # them again would report each series twice); its totals go on.
                _bound = earlier
                return earlier
        meter = provider.get_meter("agent_ledger", __version__)
        totals: dict[str, _Totals] = {}
        wait = None
        for instrument in INSTRUMENTS:
            name, kind, unit, keys, description = instrument
            if kind == "histogram":
                wait = _histogram(meter, instrument)
                continue
            totals[name] = counts = _Totals(keys)
            create = (
                meter.create_observable_counter
                if kind == "counter"
                else meter.create_observable_up_down_counter
            )
            create(name, callbacks=[counts.observe], unit=unit, description=description)
        _bound = _Bound(
            provider,
            executions=totals[_EXECUTIONS.name],
            replays=totals[_REPLAYS.name],
            takeovers=totals[_TAKEOVERS.name],
            fenced=totals[_FENCED.name],
            decisions=totals[_DECISIONS.name],
            refused=totals[_REFUSED.name],
            pending=totals[_PENDING.name],
            wait=wait,
        )
        _earlier.append(_bound)
        return _bound


def _histogram(meter: Any, instrument: Instrument) -> Any:
    name, _, unit, _, description = instrument
    try:
        return meter.create_histogram(
            name,
            unit=unit,
            description=description,
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS_S,
        )
    except TypeError:  # an API before 1.23: the SDK's default buckets
        return meter.create_histogram(name, unit=unit, description=description)


def set_meter_provider(provider: object | None) -> None:
    """Record the ledger's metrics on ``provider`` instead of the global one.

    For an application that keeps its providers to itself (or a test with an
    ``InMemoryMetricReader``). ``None`` goes back to the global provider
    (``opentelemetry.metrics.set_meter_provider``). The instruments are
    created on it at the next event. Raises ``RuntimeError`` when
    ``opentelemetry-api`` is not installed.
    """
    global _bound, _chosen
    if _api is None:
        raise RuntimeError("agent_ledger.metrics needs opentelemetry-api: pip install it")
    with _lock:
        _chosen, _bound = provider, None


def recording() -> bool:
    """Whether events are counted now: the API is installed and a provider set."""
    return _instruments() is not None


# -- events --------------------------------------------------------------------------


def executed(tool: str) -> None:
    """A handler starts (or ``begin()`` hands its caller an effect to run)."""
    bound = _instruments()
    if bound is not None:
        bound.executions.add((tool,))


def replayed(tool: str) -> None:
    """A call is answered from another call's recorded outcome."""
    bound = _instruments()
    if bound is not None:
        bound.replays.add((tool,))


def taken_over(tool: str) -> None:
    """This process's claim took the effect from a silent holder."""
    bound = _instruments()
    if bound is not None:
        bound.takeovers.add((tool,))


def commit_fenced(tool: str) -> None:
    """The store refused this attempt's outcome: another attempt or a decision holds it."""
    bound = _instruments()
    if bound is not None:
        bound.fenced.add((tool,))


def approval_entered(effect: Effect) -> None:
    """This process's step sent ``effect`` to a person (into ``requires_approval``)."""
    bound = _instruments()
    if bound is not None:
        bound.pending.add((effect.tool,))


def approval_left(waiting: Effect | None, after: Effect, outcome: str) -> None:
    """This process's step took ``after`` out of ``requires_approval``.

    ``waiting`` is the effect as read while it waited, if the step read it:
    its ``updated_at`` is when it entered ``requires_approval`` (nothing else
    writes the row while it waits), and the wait is recorded when it is
    the same attempt. ``outcome`` is one of ``OUTCOME``'s values.
    """
    bound = _instruments()
    if bound is None:
        return
    bound.pending.add((after.tool,), -1)
    if (
        waiting is None
        or waiting.status is not EffectStatus.REQUIRES_APPROVAL
        or waiting.attempt != after.attempt
    ):
        return
    seconds = (after.updated_at - waiting.updated_at).total_seconds()
    bound.wait.record(max(seconds, 0.0), {TOOL: after.tool, OUTCOME: outcome})


#: The wait histogram's outcome for each status a decision moves an effect to.
OUTCOMES: Final[Mapping[EffectStatus, str]] = MappingProxyType(
    {
        EffectStatus.READY: "approved",
        EffectStatus.DENIED: "denied",
        EffectStatus.SUCCEEDED: "resolved",
        EffectStatus.FAILED: "resolved",
        EffectStatus.CANCELED: "canceled",
    }
)
#: The outcome of a denial by the approval's deadline: the code the effect records.
EXPIRED: Final = ErrorCode.APPROVAL_EXPIRED.value


def decided(after: Effect, channel: Channel | str, action: DecisionAction | str) -> None:
    """A person's decision made the transition (counted once, by the winner)."""
    bound = _instruments()
    if bound is not None:
        bound.decisions.add((after.tool, str(channel), str(action)))


def refused(channel: Channel | str, action: DecisionAction | str, reason: DecisionCode) -> None:
    """A decision attempt was refused with ``reason``."""
    bound = _instruments()
    if bound is not None:
        bound.refused.add((str(channel), str(action), str(reason)))
