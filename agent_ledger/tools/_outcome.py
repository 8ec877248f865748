"""How the ledger answered one tool call: :class:`CallOutcome`, for the adapters.

``await tool(...)`` returns the tool's value (or raises), which is all an
application needs. An adapter that tells a *model* what happened needs more:
did the handler run now, or was the call answered from a receipt, and if so
one made in an earlier turn of the conversation (then "already done at
12:03" is the truth, "done" is not), with the receipt's key and time.
``Tool.call_outcome`` runs the call exactly as ``invoke`` does and returns
this value instead of the bare result.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from agent_ledger.effects import Effect

__all__ = ["CallOutcome"]

R_co = TypeVar("R_co", covariant=True)


@dataclass(frozen=True, slots=True)
class CallOutcome(Generic[R_co]):
    """One tool call's outcome, and where it came from.

    Exactly one of ``result`` and ``error`` holds the outcome: ``error`` is
    None when the tool succeeded. ``error`` is the tool's own failure: on
    the call that ran it, the exception the handler raised (after it was
    recorded); on a replay, ``EffectFailedError`` (or
    ``HandlerTimeoutError``). Everything that is not the tool's failure (a
    denial, a pending approval, a budget refusal, bad arguments, a store
    error) is raised by ``call_outcome`` as by ``invoke``.
    """

    #: The tool's value: its own return value on a fresh run, the recorded
    #: JSON on a replay (a tuple as a list). None when ``error`` is set.
    result: R_co | None
    #: True: answered from a recorded outcome (a receipt, another caller's run,
    #: a replay recording); this call ran no handler. False: this call ran it.
    replayed: bool
    #: True: answered from the receipt of a call made in an earlier turn of the
    #: same workflow (the effect's recorded turn is not this call's). Only
    #: known when this call has a turn (``ledger.workflow(id, turn=...)``):
    #: without one it is False. An effect created with no turn (0.2.x, or
    #: outside any turn) counts as earlier for a call that has one.
    from_earlier_turn: bool
    #: When the recorded outcome was stored, by the store's clock; None for a
    #: fresh run (it has just happened) and for a call that waits no receipt.
    completed_at: datetime | None
    #: The receipt's key (the CLI and the errors show its first 12 characters).
    idem_key: str
    #: The turn the effect was created in, and this call's turn.
    effect_turn: str | None
    turn: str | None
    #: The tool's failure, or None (see the class doc).
    error: BaseException | None = None
    #: The failure was declared retryable: calling again runs the tool again.
    retryable: bool = False
    #: The effect as the ledger last saw it for this call (None: answered
    #: without one, which does not happen for a tool call that got this far).
    effect: Effect | None = None

    @property
    def ok(self) -> bool:
        """The tool succeeded (``error`` is None)."""
        return self.error is None

    def unwrap(self) -> R_co | None:
        """``result``, or raise ``error``: what ``await tool(...)`` would have done."""
        if self.error is not None:
            raise self.error
        return self.result
