"""Retry policies: which failures of a handler are tried again, how often, how far apart.

A :class:`RetryPolicy` is given per call (``RunOptions(retry=...)``) or per
tool (``@ledger.tool(..., retry=...)``); without one a handler runs once,
because most side effects (a charge, an email) must not be repeated unless
someone said it is safe. The engine runs every try inside one claim of the
effect and records each failed try durably before the next one, so a worker
that takes the effect over continues the count (see ``engine.retrying``).

This module only decides: :meth:`RetryPolicy.retries` says whether an
exception may be tried again, :meth:`RetryPolicy.delay` how long to wait
first. The delays are a :class:`~agent_ledger.backoff.Backoff`, the one
place agent-ledger computes a delay.

Never retried, whatever ``on`` says: exceptions that are not ``Exception``
(``asyncio.CancelledError``, ``KeyboardInterrupt``), a
:class:`NonRetryableError` or any exception whose ``non_retryable``
attribute is True, and the ledger's own validation errors (a non-JSON
result fails the same way every time).
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from agent_ledger.backoff import Backoff, too_many_ms
from agent_ledger.codes import ErrorCode
from agent_ledger.errors import EffectLedgerValidationError, RetryableToolError

__all__ = [
    "RETRIES_EXHAUSTED",
    "NonRetryableError",
    "RetryPolicy",
    "Retryable",
    "asked_delay_s",
    "check_retryable",
    "failure_is_retryable",
]

#: Which recorded failures of a tool a *later call* may run again (``retryable=``):
#: exception types (one, or a tuple), or a predicate of the exception. Not a
#: retry policy (``retry=``, tries within one call): a retryable failure is
#: recorded as the call's outcome, and the next call with the key runs again.
Retryable: TypeAlias = (
    "type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]"
)

#: The error code an effect is recorded with when its tries ran out (an alias of
#: ``ErrorCode.RETRIES_EXHAUSTED``, kept for code that imports it from here).
RETRIES_EXHAUSTED: Final = ErrorCode.RETRIES_EXHAUSTED


class NonRetryableError(Exception):
    """Raise it (or a subclass) from a handler to say: do not try this again.

    Any exception with a true ``non_retryable`` attribute is treated the
    same, so an application's own error classes can opt out without
    inheriting from this one. The failure is recorded as usual, with the
    exception's ``code`` or class name.
    """

    non_retryable = True


NonRetryableError.__module__ = "agent_ledger"


def _exception_types(on: object) -> tuple[type[Exception], ...]:
    given: tuple[object, ...] = on if isinstance(on, tuple) else (on,)
    kinds: list[type[Exception]] = []
    if not given:
        raise EffectLedgerValidationError(
            "on must name at least one exception type to retry", field="on"
        )
    for kind in given:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise EffectLedgerValidationError(
                f"on must be an exception type or a tuple of them, got {kind!r}", field="on"
            )
        if not issubclass(kind, Exception):
            raise EffectLedgerValidationError(
                f"on names {kind.__name__}, which is never retried: only Exception "
                "subclasses are (cancellation and interrupts always propagate)",
                field="on",
            )
        kinds.append(kind)
    return tuple(kinds)


def _check_count(
    value: object, name: str, *, low: int, allow_none: bool = False, ms: bool = False
) -> None:
    """An int from ``low`` up; a time (``ms``) at most ``MAX_MS``."""
    if allow_none and value is None:
        return
    if type(value) is not int or value < low:
        kind = "an int or None" if allow_none else "an int"
        shown = repr(value) if type(value) is not int or value.bit_length() < 200 else "huge"
        raise EffectLedgerValidationError(
            f"{name} must be {kind} >= {low}, got {shown}", field=name
        )
    refused = too_many_ms(value, name) if ms else None
    if refused is not None:
        raise EffectLedgerValidationError(refused, field=name)


def _check_number(value: object, name: str, low: float, high: float | None) -> None:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise EffectLedgerValidationError(f"{name} must be a number, got {value!r}", field=name)
    number = float(value)  # type: ignore[arg-type]
    if number < low or (high is not None and number > high):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise EffectLedgerValidationError(f"{name} must be in {span}, got {value}", field=name)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Try a failing handler again: up to ``attempts`` tries in all, the first included.

    ``on`` is the exception type, or tuple of types, that may be retried
    (their subclasses too); it has no default, so every retry is asked for.
    Between tries the ledger waits ``initial_ms``, then ``multiplier`` times
    longer after each further failure, never more than ``max_ms``, each
    delay spread by a random factor in ``[1 - jitter, 1 + jitter]``. An
    exception may ask for its own delay with a ``retry_after_s`` attribute
    (seconds, as an HTTP ``Retry-After`` header gives it); it is used
    instead, clamped to ``max_ms``. With ``timeout_ms``, no new try starts
    later than that after this worker's first try (the budget of one claim:
    a worker that takes the effect over starts its own, and ``attempts``
    bounds both). Nothing waits after the last try.

    >>> RetryPolicy(on=TimeoutError, attempts=4, initial_ms=100, jitter=0).backoff.base(2)
    0.4
    """

    on: type[Exception] | tuple[type[Exception], ...]
    attempts: int = 3
    initial_ms: int = 200
    max_ms: int = 10_000
    multiplier: float = 2.0
    jitter: float = 0.2
    timeout_ms: int | None = None
    #: The delays, built once from the fields above.
    backoff: Backoff = field(init=False, repr=False, compare=False)
    _types: tuple[type[Exception], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        types = _exception_types(self.on)
        _check_count(self.attempts, "attempts", low=1)
        _check_count(self.initial_ms, "initial_ms", low=1, ms=True)
        _check_count(self.max_ms, "max_ms", low=1, ms=True)
        if self.max_ms < self.initial_ms:
            raise EffectLedgerValidationError(
                f"max_ms ({self.max_ms}) must not be less than initial_ms ({self.initial_ms})",
                field="max_ms",
            )
        _check_number(self.multiplier, "multiplier", 1.0, None)
        _check_number(self.jitter, "jitter", 0.0, 1.0)
        _check_count(self.timeout_ms, "timeout_ms", low=1, allow_none=True, ms=True)
        object.__setattr__(self, "_types", types)
        object.__setattr__(
            self,
            "backoff",
            Backoff(
                initial_s=self.initial_ms / 1000.0,
                multiplier=float(self.multiplier),
                max_s=self.max_ms / 1000.0,
                jitter=float(self.jitter),
            ),
        )

    def retries(self, exc: BaseException) -> bool:
        """Whether a try that raised ``exc`` may be followed by another (tries permitting)."""
        if not isinstance(exc, self._types):
            return False
        if isinstance(exc, EffectLedgerValidationError):
            return False
        try:
            return not getattr(exc, "non_retryable", False)
        except Exception:
            return True  # a broken attribute is no opt-out

    def delay(
        self,
        tried: int,
        exc: BaseException,
        *,
        uniform: Callable[[float, float], float] = random.uniform,
    ) -> float:
        """Seconds to wait after try number ``tried`` (1 = the first) failed with ``exc``."""
        asked = asked_delay_s(exc)
        if asked is not None:
            return min(asked, self.backoff.max_s)
        return self.backoff.delay(tried - 1, uniform=uniform)


def asked_delay_s(exc: BaseException) -> float | None:
    """The delay ``exc`` asks for in its ``retry_after_s`` attribute, if it is a usable one.

    A number of seconds, finite and not negative; anything else is ignored
    (the policy's own backoff applies), since a broken hint must not turn a
    retry into a crash or an endless wait.
    """
    try:
        asked: object = getattr(exc, "retry_after_s", None)
    except Exception:
        return None
    if type(asked) not in (int, float):
        return None
    try:
        seconds = float(asked)  # type: ignore[arg-type]  # an int or a float, checked above
    except OverflowError:  # an int beyond any float: no usable hint
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def check_retryable(value: object, field: str = "retryable") -> None:
    """Refuse a ``retryable=`` that is neither exception types nor a predicate."""
    if value is None:
        return
    if isinstance(value, type | tuple):
        kinds = value if isinstance(value, tuple) else (value,)
        if not kinds:
            raise EffectLedgerValidationError(
                f"{field} must name at least one exception type (or be None)", field=field
            )
        for kind in kinds:
            if not (isinstance(kind, type) and issubclass(kind, Exception)):
                raise EffectLedgerValidationError(
                    f"{field} must be exception types (Exception subclasses: a cancellation "
                    f"is never a failure to retry) or a predicate, got {kind!r}",
                    field=field,
                )
        return
    if not callable(value):
        raise EffectLedgerValidationError(
            f"{field} must be an exception type, a tuple of them, or a function "
            f"(BaseException) -> bool, got {value!r}",
            field=field,
        )
    if inspect.iscoroutinefunction(value):
        raise EffectLedgerValidationError(
            f"{field} must be a plain function returning a bool, got an async def {value!r}",
            field=field,
        )


def failure_is_retryable(exc: BaseException, retryable: Retryable | None) -> bool:
    """Whether a handler's ``exc`` is recorded as a retryable failure.

    ``RetryableToolError`` always is, and so is pydantic-ai's ``ModelRetry``
    (the framework's own "the model should call again", recognised by its
    class's name and package, so this layer imports no framework: a ledger
    tool given to ``Agent(tools=[...])`` without the adapter retries as
    with it); anything else when ``retryable`` (the tool's or the call's)
    names its type or says so. Never a cancellation or
    interrupt (not an ``Exception``), a ``NonRetryableError`` (nor anything
    with a true ``non_retryable``), or the ledger's own validation errors.
    A predicate that raises says no (the failure stays final, as by default).
    """
    if not isinstance(exc, Exception) or getattr(exc, "non_retryable", False) is True:
        return False
    if isinstance(exc, RetryableToolError) or _is_model_retry(exc):
        return True
    if retryable is None or isinstance(exc, EffectLedgerValidationError):
        return False
    if isinstance(retryable, type | tuple):
        return isinstance(exc, retryable)
    try:
        return retryable(exc) is True
    except Exception:
        return False


def _is_model_retry(exc: BaseException) -> bool:
    """Whether ``exc`` is pydantic-ai's ``ModelRetry`` (or a subclass of it)."""
    return any(
        cls.__name__ == "ModelRetry" and cls.__module__.split(".")[0] == "pydantic_ai"
        for cls in type(exc).__mro__
    )
