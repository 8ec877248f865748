"""People's decisions on effects: request approval, approve, deny, cancel, reopen.

Each decision is one compare-and-set in the store (``Store.transition``, or
``Store.reopen``), so two operators acting on the same stale screen cannot
both win: the second gets False. Who decided, and their note or reason, go
on the receipt.
"""

from __future__ import annotations

import inspect
import logging
from typing import Final

from agent_ledger.effects import Effect, EffectError, storable_text
from agent_ledger.errors import EffectLedgerValidationError, require_str
from agent_ledger.observability import effect_fields, log_effect, logger
from agent_ledger.options import LedgerHooks
from agent_ledger.status import REOPENABLE, EffectStatus
from agent_ledger.stores.base import Decision, SchemaCheck, Store

__all__ = ["Decisions", "notify_approval_required"]


class Decisions:
    """The decision steps of one ledger."""

    def __init__(self, store: Store, schema: SchemaCheck) -> None:
        self._store = store
        self._schema = schema

    async def request_approval(self, idem_key: str, hooks: LedgerHooks) -> bool:
        # ready -> requires_approval only: the transition table refuses a
        # running effect (see agent_ledger.status), so the store's
        # compare-and-set does too.
        moved = await self._move(idem_key, EffectStatus.REQUIRES_APPROVAL, None, None)
        if moved is not None:
            await notify_approval_required(moved, hooks)
        return moved is not None

    async def approve(self, idem_key: str, *, by: str | None, note: str | None) -> bool:
        decision = _decision(by, note)
        return await self._move(idem_key, EffectStatus.READY, None, decision) is not None

    async def deny(self, idem_key: str, *, reason: str | None, by: str | None) -> bool:
        error = EffectError(message=_reason(reason, "denied"), code="denied")
        decision = _decision(by, None)
        return await self._move(idem_key, EffectStatus.DENIED, error, decision) is not None

    async def cancel(self, idem_key: str, *, reason: str | None, by: str | None) -> bool:
        error = EffectError(message=_reason(reason, "canceled"), code="canceled")
        decision = _decision(by, None)
        return await self._move(idem_key, EffectStatus.CANCELED, error, decision) is not None

    async def reopen(self, idem_key: str, *, by: str, reason: str) -> bool:
        require_str(idem_key, "idem_key")
        by, reason = _required_text(by, "by"), _required_text(reason, "reason")
        await self._schema.ensure()
        moved = await self._store.reopen(idem_key, by=by, reason=reason)
        if moved is not None:
            log_effect(logging.INFO, f"effect reopened by {by}: {reason}", moved)
            return True
        # Nothing moved: say why when it never could (a read, off the happy path).
        found = await self._store.find(idem_key)
        if found is not None and found.status not in REOPENABLE and found.status.is_terminal:
            raise EffectLedgerValidationError(
                _NOT_REOPENED[found.status].format(key=idem_key[:12], tool=found.tool),
                field="idem_key",
            )
        return False

    async def _move(
        self,
        idem_key: str,
        target: EffectStatus,
        error: EffectError | None,
        decision: Decision | None,
    ) -> Effect | None:
        require_str(idem_key, "idem_key")
        await self._schema.ensure()
        moved = await self._store.transition(
            idem_key, target=target, error=error, decision=decision
        )
        if moved is not None:
            log_effect(logging.INFO, f"effect moved to {target.value}", moved)
        return moved


async def notify_approval_required(effect: Effect, hooks: LedgerHooks) -> None:
    """Call ``hooks.on_approval_required(effect)`` (sync or async); its failure is
    logged, never raised.

    The effect is already stored as waiting for approval: a broken
    notification must not abort the caller, who would otherwise retry into
    the same pending effect and never hear back.
    """
    hook = hooks.on_approval_required
    if hook is None:
        return
    try:
        pending = hook(effect)
        if inspect.isawaitable(pending):
            await pending
    except Exception:
        logger.exception(
            "on_approval_required hook raised; the effect still waits for approval",
            extra=effect_fields(effect),
        )


def _decision(by: str | None, note: str | None) -> Decision:
    for value, name in ((by, "by"), (note, "note")):
        if value is not None and not isinstance(value, str):
            raise EffectLedgerValidationError(
                f"{name} must be a string or None, got {type(value).__name__}", field=name
            )
    return Decision(
        by=storable_text(by) if by else None, note=storable_text(note) if note else None
    )


#: Why ``reopen`` refuses the terminal statuses it never takes an effect from.
_NOT_REOPENED: Final = {
    EffectStatus.SUCCEEDED: (
        "effect {key}… ({tool}) succeeded: its result is the receipt, and reopening it "
        "would run the side effect again. Nothing changed; a new request needs a new "
        "call (a new key)."
    ),
    EffectStatus.DENIED: (
        "effect {key}… ({tool}) was denied: a denial stands, and reopening it would run "
        "what a person refused. Nothing changed; a new decision needs a new call (a new key)."
    ),
}


def _required_text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise EffectLedgerValidationError(
            f"{name} is required: a non-empty string saying "
            f"{'who reopens the effect' if name == 'by' else 'why'}, got {value!r}",
            field=name,
        )
    return storable_text(value)


def _reason(reason: str | None, what: str) -> str:
    if reason is None:
        return what
    if not isinstance(reason, str):
        raise EffectLedgerValidationError(
            f"reason must be a string or None, got {type(reason).__name__}", field="reason"
        )
    return reason or what
