"""Whose outcome an exception out of ``Tool.invoke`` is: this call's, or the tool's failure.

A tool's function may itself call ledger tools (a cleanup that drops a
table through the ledger, a tree walk that calls itself). A ledger error
raised by such a nested call (``EffectDeniedError``, ``EffectFailedError``,
``EffectLedgerValidationError``...) comes out of ``invoke`` exactly as this
call's own would, but it is not about this call: it is an exception the
tool raised, which the engine recorded as this effect's failure, and every
replay answers that failure (``EffectFailedError``). Read as this call's
own outcome, the first answer would differ from every replay, and could
say false things ("a person denied this call, it did not run", of a call
that ran and failed).

The rule, one place for every adapter: a ledger error is about this call
only if it names this call's own effect (the same idempotency key). One
that names another effect is the tool's. One that names none (a
validation, store or invariant error) is the tool's if the run recorded it
as this effect's failure, and this call's own otherwise (it was raised
before or around the run: arguments refused, no workflow, a store down).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent_ledger.adapters._messages import first_raised
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import EffectFailedError, EffectLedgerError
from agent_ledger.status import EffectStatus

if TYPE_CHECKING:
    from agent_ledger.calls import Scope
    from agent_ledger.options import RunOptions
    from agent_ledger.tools import CallOutcome, Tool, ToolLedger

__all__ = ["call_key", "is_tool_failure", "outcome_of", "recorded", "recorded_failure"]


def call_key(
    tool: Tool[Any],
    arguments: Mapping[str, object],
    *,
    call_id: str | None = None,
    scope: Scope | None = None,
    default_scope: Scope | None = None,
) -> str:
    """The key ``tool.invoke(arguments, call_id=..., scope=..., default_scope=...)`` runs
    under, here (in the current workflow and turn).

    Raises ``EffectLedgerValidationError`` as the run would (arguments that
    do not bind or that a key cannot hold, no workflow, a ``"turn"`` or
    ``"call"`` scope without its id).
    """
    call = tool.call_for(arguments, call_id=call_id, scope=scope, default_scope=default_scope)
    return tool.ledger.idem_key(call)


async def outcome_of(
    tool: Tool[Any],
    arguments: Mapping[str, object],
    *,
    call_id: str | None = None,
    run_options: RunOptions | None = None,
    scope: Scope | None = None,
    default_scope: Scope | None = None,
) -> CallOutcome[Any]:
    """Run the call as ``tool.invoke`` does and return its :class:`CallOutcome`
    (``Tool.call_outcome``): the adapters' one way to learn whether a call ran
    now or was answered from a receipt (an earlier turn's included) and
    whether its failure may be retried. ``adapters._messages.outcome_text``
    turns it into the model's text."""
    return await tool.call_outcome(
        arguments,
        call_id=call_id,
        run_options=run_options,
        scope=scope,
        default_scope=default_scope,
    )


async def is_tool_failure(ledger: ToolLedger, key: str | None, error: Exception) -> bool:
    """Whether ``error``, raised out of the run of the call keyed ``key``, is the tool's own.

    True for any exception but the ledger's, and for a ledger error about
    another effect (see the module doc); False for this call's own ledger
    outcome. ``key`` None (no key could be made: the call was refused
    before it ran) makes every ledger error this call's own.
    """
    if not isinstance(error, EffectLedgerError):
        return True
    if key is None:
        return False
    named = _named_key(error)
    if named is not None:
        return named != key
    try:
        effect = await ledger.find_by_idem_key(key)
    except Exception:
        return False  # the store cannot say: the error stands as this call's
    return effect is not None and _recorded_as_failure(effect, error)


async def recorded_failure(ledger: ToolLedger, key: str) -> EffectFailedError | None:
    """The effect's failure as a replay raises it, or None if it is not recorded failed.

    Answering a tool's failure from this record, the first call reads what
    every replay reads. The record may be missing if the effect was taken
    over or reopened meanwhile (or the store cannot be read): None.
    """
    try:
        effect = await ledger.find_by_idem_key(key)
    except Exception:
        return None
    if effect is None or effect.status is not EffectStatus.FAILED:
        return None
    return EffectFailedError(effect)


def recorded(error: Exception) -> tuple[str, str | None]:
    """The message and code the ledger records for ``error`` (its ``EffectError``).

    The engine's rule, so a first failure and its replays
    (``EffectFailedError.message`` and ``.code``) read the same; a test
    holds the two together.
    """
    try:
        message = str(error) or type(error).__name__
    except Exception:
        message = f"{type(error).__name__} (its message could not be read)"
    try:
        code = getattr(error, "code", None)
        if code is None or isinstance(code, bool):
            code = type(error).__name__
        elif not isinstance(code, str):
            code = str(code)
    except Exception:
        code = type(error).__name__
    stored = EffectError(message=message, code=code)  # made storable as the store's copy is
    return stored.message, stored.code


def _named_key(error: EffectLedgerError) -> str | None:
    """The key of the effect ``error`` is about, if it names one."""
    effect = getattr(error, "effect", None)
    if isinstance(effect, Effect):
        return effect.idem_key
    key = getattr(error, "idem_key", None)
    return key if isinstance(key, str) else None


def _recorded_as_failure(effect: Effect, error: Exception) -> bool:
    """Whether ``effect`` is recorded failed with ``error`` (or, its tries having run
    out, with ``error`` as its last try's)."""
    if effect.status is not EffectStatus.FAILED or effect.error is None:
        return False
    message, code = recorded(error)
    if (effect.error.message, effect.error.code) == (message, code):
        return True
    return first_raised(EffectFailedError(effect)) == (code, message)
