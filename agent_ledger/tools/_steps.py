"""Where a tool call goes when it is a step of something above the tools layer.

A saga (``agent_ledger.sagas``, a layer above this one) makes every tool call
inside it a step: recorded before its effect begins, undone if a later step
fails. The tools layer cannot import it, so the saga puts a ``StepRunner`` in
this context variable and ``Tool.__call__``/``invoke`` hand their run to it.
asyncio copies the context into tasks started inside, as with workflows.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from agent_ledger.calls import ToolCall
from agent_ledger.effects import Effect
from agent_ledger.options import LedgerHooks, RunOptions

if TYPE_CHECKING:
    from agent_ledger.ledger import EffectLedger
    from agent_ledger.tools._tool import Tool


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


STEP_RUNNER: ContextVar[StepRunner | None] = ContextVar("agent_ledger_step_runner", default=None)
