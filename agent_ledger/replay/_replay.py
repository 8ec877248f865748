"""``ledger.replay(workflow_id, source=...)``: re-run a recorded workflow without its side effects.

A ``Replay`` is the block's ``Recording`` (``agent_ledger.context``): the
ledger asks it about every call made inside the block, once the call is
checked and its key made, and before anything is stored. The answer is the
recorded effect with the call's key, so a call is matched by what it asks
for (workflow, tool, key args), never by when it is made: nested calls,
``asyncio.gather`` and calls in another order all find their own receipts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Final

import orjson

from agent_ledger.context import check_recording_exit, enter_recording, exit_recording
from agent_ledger.effects import Effect, JSONValue, NewEffect
from agent_ledger.errors import EffectLedgerValidationError, UnrecordedEffectError
from agent_ledger.observability import logger
from agent_ledger.replay._sources import read_export, read_store
from agent_ledger.stores._memory_budgets import InMemoryBudgets
from agent_ledger.stores.base import Store
from agent_ledger.tools import WorkflowScope

if TYPE_CHECKING:
    from agent_ledger.core import LedgerCore

__all__ = ["Replay"]

#: How much of one arg's value an error shows.
_SHOWN: Final = 60
_ABSENT: Final = object()


class Replay:
    """A ``with`` / ``async with`` block whose calls are answered from a recorded run.

    Made by ``EffectLedger.replay``; see there and ``docs/replay.md``. The
    block is also ``ledger.workflow(workflow_id)``, so tools called inside
    make the keys the recorded run made. Only this ledger's calls are
    answered (another ledger's run as usual), and a source that is a store
    is only read, so the recording is the same before and after.
    """

    def __init__(
        self,
        ledger: LedgerCore[object],
        workflow_id: str,
        source: Store | str | os.PathLike[str],
        *,
        strict: bool = True,
    ) -> None:
        self.ledger = ledger
        self._scope = WorkflowScope(workflow_id)  # checks the id as any workflow's
        self.workflow_id = workflow_id
        if not isinstance(strict, bool):
            raise EffectLedgerValidationError(
                f"strict must be True or False, got {strict!r}", field="strict"
            )
        self.strict = strict
        #: The budgets the replayed code declares, simulated from the recording
        #: (``tools._budget``): a recorded call books its recorded charge here,
        #: so a call the recorded run's budget refused is refused again, before
        #: anything runs. Kept in memory for this block; never stored.
        self.budgets = InMemoryBudgets()
        self._store: Store | None = None
        self._effects: Mapping[str, Effect] | None = None
        if isinstance(source, (str, os.PathLike)):
            self._effects = read_export(source, workflow_id)
        elif isinstance(source, type):
            # A runtime-checkable Protocol accepts a class that has the methods,
            # whose methods then fail unbound (TypeError) at the first read.
            raise EffectLedgerValidationError(
                f"replay source is the class {source.__name__}, not a store: pass the "
                f"store holding the recorded run (an instance, e.g. "
                f"{source.__name__}(...) opened on that database) or the path of its export",
                field="source",
            )
        elif isinstance(source, Store):
            if source is ledger.store:
                raise EffectLedgerValidationError(
                    "replay source is this ledger's own store: a replay reads the recording "
                    "from one store and keeps anything it stores (a saga's rows, calls run "
                    "with strict=False) in the ledger's, so they must differ, or the "
                    "recording would change. Replay with a ledger on another store, e.g. "
                    "EffectLedger(EffectLedgerOptions(store=MemoryStore())).",
                    field="source",
                )
            self._store = source
        else:
            raise EffectLedgerValidationError(
                "replay source must be a Store holding the recorded run or the path of "
                f"its export (`agent-ledger export --workflow {workflow_id} --format "
                f"jsonl`), got {type(source).__name__}",
                field="source",
            )

    # -- the block ---------------------------------------------------------------------

    def __enter__(self) -> Replay:
        enter_recording(self)
        self._scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        check_recording_exit(self)  # an inner replay left open: refused
        self._scope.check_innermost()  # a workflow() block left open inside: refused
        self._scope.__exit__(exc_type, exc, tb)
        exit_recording(self)

    async def __aenter__(self) -> Replay:
        await self._recording()  # a store is read here: a wrong one fails before the code runs
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"Replay({self.workflow_id!r}, strict={self.strict})"

    # -- answering calls ---------------------------------------------------------------

    async def _recording(self) -> Mapping[str, Effect]:
        effects = self._effects
        if effects is None:
            assert self._store is not None
            # Two first calls at once may both read it: the same rows, so either will do.
            effects = self._effects = await read_store(self._store, self.workflow_id)
        return effects

    async def answer(self, new: NewEffect, legacy_key: str | None = None) -> Effect | None:
        """The recorded effect with ``new``'s key, if it finished; else refuse or run it.

        With ``legacy_key`` (``legacy_keys=True``), a call with no recording
        under its own key is answered by the effect the recording's store
        imported under its 0.2.x key, as the recorded run's call was.

        Strict: raise ``UnrecordedEffectError`` saying why there is no
        outcome to give. Otherwise log that, and return None: the call runs
        on the ledger's own store, as it would outside the block.
        """
        effects = self._effects if self._effects is not None else await self._recording()
        recorded = effects.get(new.idem_key) if new.workflow_id == self.workflow_id else None
        if recorded is None and legacy_key is not None and new.workflow_id == self.workflow_id:
            recorded = await self._imported(new, legacy_key, effects)
        if recorded is not None and recorded.status.is_terminal:
            return recorded
        message, differing = self._why_unrecorded(new, recorded, effects)
        if self.strict:
            raise UnrecordedEffectError(
                f"{message}. Nothing ran. To run such calls (on this ledger's store) and "
                "go on, replay with strict=False.",
                workflow_id=new.workflow_id,
                tool=new.tool,
                idem_key=new.idem_key,
                differing=differing,
                recorded_status=None if recorded is None else recorded.status,
            )
        logger.warning(
            "%s; strict=False, so it runs on the ledger's own store",
            message,
            extra={"idem_key": new.idem_key, "tool": new.tool, "workflow_id": new.workflow_id},
        )
        return None

    async def _imported(
        self, new: NewEffect, legacy_key: str, effects: Mapping[str, Effect]
    ) -> Effect | None:
        """The recorded effect imported under ``legacy_key``, if it is this call's
        (same workflow and tool: the engine's rule, ``engine.legacy_keys.follow_legacy_key``).

        Only a store knows what was imported under which 0.2.x key (a read:
        ``find_legacy``); an export does not carry that map, so there such a
        call is answered only under its own key.
        """
        if self._store is None:
            return None
        found = await self._store.find_legacy(legacy_key)
        if found is None or (found.workflow_id, found.tool) != (new.workflow_id, new.tool):
            return None
        return effects.get(found.idem_key)

    async def recorded(self, idem_key: str) -> Effect | None:
        """The finished effect recorded under ``idem_key``, or None."""
        effects = self._effects if self._effects is not None else await self._recording()
        effect = effects.get(idem_key)
        return effect if effect is not None and effect.status.is_terminal else None

    def _why_unrecorded(
        self, new: NewEffect, recorded: Effect | None, effects: Mapping[str, Effect]
    ) -> tuple[str, tuple[str, ...]]:
        """Why the recording cannot answer ``new``, and the args it differs in."""
        about = f"replay of workflow {self.workflow_id!r}: a call of tool {new.tool!r}"
        if recorded is not None and recorded.parked:
            return (
                f"{about} was recorded (effect {recorded.idem_key[:12]}…) parked for a "
                "person: its worker died mid-handler, so its side effect may have "
                "happened and there is no outcome to replay. Settle it (resolve, approve "
                "or deny), then export the run again",
                (),
            )
        if recorded is not None:
            return (
                f"{about} was recorded (effect {recorded.idem_key[:12]}…) but had not "
                f"finished: it was {recorded.status.value}, so there is no outcome to "
                "replay. Export the run once that call has finished",
                (),
            )
        if new.workflow_id != self.workflow_id:
            return (
                f"{about} belongs to workflow {new.workflow_id!r}, which is not the one "
                "replayed (the tool is pinned to it, or a ledger.workflow() block inside "
                "the replay chose it)",
                (),
            )
        same_tool = [e for e in effects.values() if e.tool == new.tool]
        if not same_tool:
            tools = sorted({e.tool for e in effects.values()})
            return (
                f"{about} has no recording: no call of that tool was recorded "
                f"(the recording has calls of {tools})",
                (),
            )
        args = _decoded(new.args_canonical)
        closest, differing = min(
            ((e, _differing(args, e.args)) for e in same_tool),
            key=lambda pair: (len(pair[1]), pair[0].created_at),
        )
        recorded_args = closest.args
        turn = _turn_of(new)
        other_turns = sorted(
            {e.turn for e in same_tool if not _differing(args, e.args) and e.turn != turn},
            key=str,
        )
        if not differing and other_turns:
            shown_turns = ", ".join(repr(t) for t in other_turns[:5])
            return (
                f"{about} has no recording in its turn: its args equal those of the call "
                f"recorded in turn {shown_turns} (effect {closest.idem_key[:12]}…), but this "
                f"call is in turn {turn!r}, and scope 'turn' keys a call by its turn. The "
                "replayed run has more turns than the recording, or names them otherwise "
                "(a framework's made-up turn ids differ on every run, and a replay never "
                "guesses which recorded turn one stands for): give each call the recorded "
                "turn (`ledger.workflow(id, turn=...)` around it; pydantic-ai: "
                "`agent.run(..., run_id=...)`; LangGraph: the HumanMessage's id)",
                (),
            )
        if not differing:
            return (
                f"{about} has no recording: its args equal those of the recorded call "
                f"{closest.idem_key[:12]}… but its key does not (its resource or "
                "idempotency_keys differ)",
                (),
            )
        shown = "; ".join(
            f"{name}: {_show(args.get(name, _ABSENT))} now, "
            f"{_show(recorded_args.get(name, _ABSENT))} recorded"
            for name in differing[:5]
        )
        more = f"; and {len(differing) - 5} more" if len(differing) > 5 else ""
        return (
            f"{about} has no recording: its args differ from the closest recorded call "
            f"of that tool ({closest.idem_key[:12]}…) in {list(differing)} ({shown}{more})",
            differing,
        )


def _turn_of(new: NewEffect) -> str | None:
    """The turn a new effect would be recorded with (its ``Scoped`` history event)."""
    try:
        history = orjson.loads(new.history)
    except orjson.JSONDecodeError:
        return None
    if history and isinstance(history[0], dict):
        turn = history[0].get("turn")
        return turn if isinstance(turn, str) else None
    return None


def _decoded(canonical: str) -> dict[str, JSONValue]:
    args: dict[str, JSONValue] = orjson.loads(canonical)
    return args


def _canonical(value: object) -> bytes:
    """A value as canonical JSON, so ``1`` and ``1.0`` (and ``1`` and ``true``) differ."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _differing(args: Mapping[str, JSONValue], recorded: Mapping[str, JSONValue]) -> tuple[str, ...]:
    """The names of the args whose values differ (or that only one side has), sorted."""
    names = sorted(args.keys() | recorded.keys())
    return tuple(
        name
        for name in names
        if name not in args
        or name not in recorded
        or _canonical(args[name]) != _canonical(recorded[name])
    )


def _show(value: object) -> str:
    if value is _ABSENT:
        return "absent"
    text = _canonical(value).decode()
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"
