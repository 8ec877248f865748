"""A tool's saga settings: ``compensate``, ``compensate_if`` and ``failure_scope``.

A tool carries them (``Tool.compensate`` and so on) but only a saga reads
them, so this layer checks them, when ``ledger.tool()`` registers the tool:
a bad setting raises there, before any saga runs.
"""

from __future__ import annotations

from agent_ledger.calls import ToolCall
from agent_ledger.errors import EffectLedgerValidationError

__all__ = ["check_step_settings"]


def check_step_settings(
    name: str, compensate: str | None, compensate_if: object, failure_scope: object
) -> None:
    """Check a tool's saga settings when ``ledger.tool()`` registers it, naming what
    was wrong: the tools layer keeps them, the saga layer says what they may be."""
    if compensate is not None:
        if not isinstance(compensate, str) or not compensate:
            raise EffectLedgerValidationError(
                f"tool {name!r}: compensate names the tool that undoes it, got {compensate!r}",
                field="compensate",
            )
        if compensate == name:
            raise EffectLedgerValidationError(
                f"tool {name!r} cannot compensate itself: name the tool that undoes it",
                field="compensate",
            )
        ToolCall(workflow_id="-", tool=compensate)  # the checks any tool name gets
    if compensate_if not in ("succeeded", "attempted"):
        raise EffectLedgerValidationError(
            f"tool {name!r}: compensate_if must be 'succeeded' (undo only what succeeded) or "
            f"'attempted' (undo also a failed call, which may have taken effect), got "
            f"{compensate_if!r}",
            field="compensate_if",
        )
    if failure_scope not in ("saga", "step"):
        raise EffectLedgerValidationError(
            f"tool {name!r}: failure_scope must be 'saga' (a failure rolls the saga back) or "
            f"'step' (it is recorded and the saga goes on), got {failure_scope!r}",
            field="failure_scope",
        )
