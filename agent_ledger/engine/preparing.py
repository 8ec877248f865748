"""Preparing a call: everything checked and computed before anything is stored.

A call that is wrong in any way (not a ``ToolCall``, arguments that are not
JSON or too large, options or hooks of the wrong type, an approval policy
that is an ``async def``) raises here, so bad input never leaves a row
behind. What comes out, :class:`Prepared`, is what ``run()`` and
``begin()`` share: the effect to insert, the resolved options and hooks.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple

from agent_ledger.calls import ToolCall
from agent_ledger.context import current_turn
from agent_ledger.effects import scoped_history
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.keys import DEFAULT_MAX_ARGS_SIZE_BYTES, CanonicalCall, canonicalize
from agent_ledger.legacy.keys import legacy_key_or_none
from agent_ledger.options import (
    EffectLedgerOptions,
    LedgerHooks,
    ResolvedRunOptions,
    RunOptions,
    merge_run_options,
    resolve,
)
from agent_ledger.stores.base import NewEffect

__all__ = ["Prepared", "Preparer"]


class Prepared(NamedTuple):
    """A checked call, ready to acquire: what ``run()`` and ``begin()`` share."""

    new: NewEffect
    opts: ResolvedRunOptions
    hooks: LedgerHooks
    needs_approval: bool
    #: The call's ``validate_keys``: checked against an effect it finds.
    validate_keys: Sequence[str] | Literal["all"] | None = None
    #: The call's 0.2.x key, with ``legacy_keys=True`` (None otherwise).
    legacy_key: str | None = None
    #: The ``requires_approval`` policy hook, bound to the call, still to be asked:
    #: ``acquire`` asks it only when the key is not stored yet (fresh calls only).
    policy: Callable[[], bool] | None = None


class Preparer:
    """The ledger's defaults, and the checks every call goes through with them."""

    def __init__(self, options: EffectLedgerOptions, hooks: LedgerHooks) -> None:
        self._defaults = options.defaults.run
        self._resolved_defaults = resolve(self._defaults)
        self._max_args = options.max_args_size_bytes or DEFAULT_MAX_ARGS_SIZE_BYTES
        self._legacy_keys = options.legacy_keys
        self.hooks = hooks

    def prepare(
        self, call: ToolCall, run_options: RunOptions | None, hooks: LedgerHooks | None
    ) -> Prepared:
        """Check everything about a call before anything is stored."""
        # No options, no hooks (the common call) inline: prepare runs on every call.
        opts = self._resolved_defaults if run_options is None else self.run_options(run_options)
        hooks = self.hooks if hooks is None else self._hooks(hooks)
        call = with_turn(call)
        canon = self._canonical(call)
        # The policy hook is asked later, in acquire(), and only when the key
        # is not stored yet: fresh calls only, never a replay.
        hook = hooks.requires_approval
        needs_approval = opts.requires_approval
        policy = (
            None
            if hook is None or needs_approval
            else functools.partial(_policy_says_yes, hook, call)
        )
        scope = call.scope
        # The creator's lease is recorded with the effect: others judge its
        # heartbeat by it, never by their own (maybe shorter) window.
        new = NewEffect(
            canon.idem_key,
            call.workflow_id,
            call.call_id,
            call.tool,
            canon.args_canonical,
            canon.resource_id_canonical,
            needs_approval,
            opts.stale_after_ms,
            scoped_history(scope, call.turn, call.call_id),
        )
        # 0.2.x keyed by workflow and args alone: only a "workflow" call is one of its.
        legacy = legacy_key_or_none(call) if self._legacy_keys and scope == "workflow" else None
        return Prepared(new, opts, hooks, needs_approval, call.validate_keys, legacy, policy)

    def approval_policy(
        self, run_options: RunOptions | None, hooks: LedgerHooks | None
    ) -> bool | Callable[[ToolCall], bool]:
        """Which fresh calls ``prepare`` would make wait for a person, with these options.

        ``True`` (all: ``requires_approval`` resolved to True), ``False``
        (none: it resolved to False and there is no policy hook) or the
        hook, asked per call exactly as ``prepare`` asks it.
        """
        opts = self.run_options(run_options)
        hooks = self._hooks(hooks)
        if opts.requires_approval:
            return True
        policy = hooks.requires_approval
        if policy is None:
            return False
        return functools.partial(_policy_says_yes, policy)

    def idem_key(self, call: ToolCall) -> str:
        """The idempotency key ``prepare`` computes for ``call`` (here: its turn
        taken from ``ledger.workflow(id, turn=...)`` when it names none)."""
        return self._canonical(with_turn(call)).idem_key

    def run_options(self, run_options: RunOptions | None) -> ResolvedRunOptions:
        """A call's options over the ledger's defaults, resolved."""
        if run_options is None:
            return self._resolved_defaults
        if not isinstance(run_options, RunOptions):
            raise EffectLedgerValidationError(
                f"run_options must be a RunOptions, got {type(run_options).__name__}",
                field="run_options",
            )
        return resolve(merge_run_options(self._defaults, run_options))

    def _hooks(self, hooks: LedgerHooks | None) -> LedgerHooks:
        if hooks is None:
            return self.hooks
        if not isinstance(hooks, LedgerHooks):
            raise EffectLedgerValidationError(
                f"hooks must be a LedgerHooks, got {type(hooks).__name__}", field="hooks"
            )
        return hooks

    def _canonical(self, call: ToolCall) -> CanonicalCall:
        if not isinstance(call, ToolCall):
            raise EffectLedgerValidationError(
                f"call must be a ToolCall, got {type(call).__name__}", field="call"
            )
        return canonicalize(call, self._max_args)


def with_turn(call: ToolCall) -> ToolCall:
    """``call`` with the turn of the ``ledger.workflow(id, turn=...)`` around it, when
    it names none itself and that block is its workflow's (any scope: the turn
    is recorded with a new effect; a ``"turn"`` call is keyed by it)."""
    if not isinstance(call, ToolCall) or call.turn is not None:
        return call
    turn = current_turn(call.workflow_id)
    if turn is None:
        return call
    return dataclasses.replace(call, turn=turn)


def _policy_says_yes(policy: Callable[[ToolCall], object], call: ToolCall) -> bool:
    answer = policy(call)
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()  # never awaited: no "was never awaited" warning
        raise EffectLedgerValidationError(
            "requires_approval must be a plain function returning a bool; it returned an "
            "awaitable (an async def?), which would read as True for every call",
            field="requires_approval",
        )
    return bool(answer)
