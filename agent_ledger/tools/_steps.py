"""Where a tool call goes when it is a step of something above the tools layer.

A saga (``agent_ledger.sagas``, a layer above this one) makes every tool call
inside it a step: recorded before its effect begins, undone if a later step
fails. The tools layer cannot import it, so the saga makes itself the
context's step runner (``agent_ledger.context.set_step_runner``) and
``Tool.__call__``/``invoke`` hand their run to it. asyncio copies the context
into tasks started inside, as with workflows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agent_ledger.calls import ToolCall
from agent_ledger.context import step_runner as _current_runner
from agent_ledger.effects import Effect
from agent_ledger.options import LedgerHooks, RunOptions

if TYPE_CHECKING:
    from agent_ledger.ledger import EffectLedger
    from agent_ledger.tools._tool import Tool


@runtime_checkable
class StepRunner(Protocol):
    """Runs one tool call as a step; returns what ``ledger.run()`` would."""

    ledger: EffectLedger

    async def run_step(
        self,
        tool: Tool[object],
        call: ToolCall,
        handler: Callable[[Effect], object],
        run_options: RunOptions | None,
        hooks: LedgerHooks | None,
    ) -> object: ...


def step_runner(ledger: object) -> StepRunner | None:
    """The step runner of ``ledger``'s calls made here (a saga of that ledger), or None.

    The context keeps it as ``object`` (it cannot name this layer's types);
    only a ``StepRunner`` is ever put there, and this is where it is known
    as one."""
    runner = _current_runner()
    if runner is None or not isinstance(runner, StepRunner) or runner.ledger is not ledger:
        return None
    return runner
