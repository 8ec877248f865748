"""CrewAI: a ledger tool as a CrewAI ``BaseTool``, and a CrewAI tool run through the ledger.

``as_crewai_tool(tool)`` gives a tool registered with ``@ledger.tool`` to a
CrewAI ``Agent``: a ``BaseTool`` whose arguments schema is the function's
signature (``effect`` left out) and whose every run is one ledger call
(``arun``: ``Tool.invoke``; ``run``, from sync code: ``Tool.invoke_sync``,
on the ledger's own event-loop thread). ``wrap_crewai_tool(ledger,
base_tool, ...)`` registers a ledger tool that runs a CrewAI tool you
already have and returns the ``BaseTool`` to give the agent in its place.

CrewAI validates the arguments into Python objects (``model_dump()``);
they are turned back into their JSON before the key is made, so the key is
the one a direct call (or another adapter) with the same JSON makes.

What reaches whom. A CrewAI agent reads a tool's result as text, and
CrewAI turns a tool's exception into an error the agent reads, so:

* a denial, a pending approval (``wait_for_approval=False``), a payload
  mismatch or a handler past its deadline is *returned* as the text the
  model should read (``for_model``), so the agent can go on;
* arguments that do not fit raise CrewAI's own ``ValueError`` (from
  ``BaseTool``) or ``MalformedToolCall``, before anything is stored;
* everything else (the tool's own exception; on a replay
  ``EffectFailedError``; ``BudgetExceededError``; a replay that diverged)
  is raised as it is.

CrewAI pins older ``mcp``, ``openai`` and ``pydantic`` releases than the
other extras, so it has an extra of its own (``crewai``, not in ``dev``);
docs/adapters/crewai.md says which versions are tested together.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from agent_ledger.adapters._common import missing_extra

try:
    from crewai.tools import BaseTool
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise missing_extra(
        __name__, "CrewAI", "crewai", "(in an environment of its own: see docs/adapters/crewai.md)"
    ) from exc
from pydantic import BaseModel, ConfigDict, PrivateAttr, create_model

from agent_ledger.adapters._messages import earlier_turn_text, for_model
from agent_ledger.adapters._signature import (
    REQUIRED,
    JsonArguments,
    arguments,
    check_storable,
    description,
    dressed,
    name_for,
    refuse_factories,
    refuse_names,
)
from agent_ledger.context import current_turn, current_workflow
from agent_ledger.errors import (
    ApprovalPendingError,
    EffectDeniedError,
    EffectLedgerValidationError,
    EffectPayloadMismatchError,
    EffectTimeoutError,
)
from agent_ledger.keys import canonical_json
from agent_ledger.options import RunOptions
from agent_ledger.tools import CallOutcome, Tool

if TYPE_CHECKING:
    from agent_ledger.calls import Scope, ToolCall
    from agent_ledger.ledger import EffectLedger

__all__ = ["LedgerCrewTool", "as_crewai_tool", "wrap_crewai_tool"]

#: The ledger outcomes a CrewAI agent reads as the tool's answer (see the module doc).
_TOLD: Final = (
    ApprovalPendingError,
    EffectDeniedError,
    EffectPayloadMismatchError,
    EffectTimeoutError,
)


class LedgerCrewTool(BaseTool):  # type: ignore[misc]  # CrewAI is untyped where mypy runs
    """A CrewAI ``BaseTool`` whose every run is one run of a ledger tool (``ledger_tool``).

    Made by ``as_crewai_tool`` and ``wrap_crewai_tool``; give it to a CrewAI
    ``Agent(tools=[...])`` like any tool.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    _ledger_tool: Tool[Any] = PrivateAttr()
    _to_json: Any = PrivateAttr()
    _options: RunOptions | None = PrivateAttr(default=None)

    @property
    def ledger_tool(self) -> Tool[Any]:
        """The ledger tool this CrewAI tool runs."""
        return self._ledger_tool

    def _values(self, kwargs: dict[str, Any]) -> dict[str, object]:
        tool = self._ledger_tool
        values = tool.bind_arguments(self._to_json(kwargs, tool.name))
        check_storable(tool, values)
        return values

    def _default_scope(self) -> Scope | None:
        """``"turn"`` where the call has a turn (``ledger.workflow(id, turn=...)``
        around the kickoff), as the other adapters key by it; else the tool's own
        scope or ``"workflow"``. A tool's ``scope=`` always wins."""
        tool = self._ledger_tool
        return "turn" if current_turn(tool.workflow_id or current_workflow()) else None

    def _run(self, **kwargs: Any) -> Any:
        values = self._values(kwargs)
        try:
            outcome = self._ledger_tool.call_outcome_sync(
                values, run_options=self._options, default_scope=self._default_scope()
            )
        except _TOLD as exc:
            return for_model(exc) or str(exc)
        return _answer(outcome)

    async def _arun(self, **kwargs: Any) -> Any:
        values = self._values(kwargs)
        try:
            outcome = await self._ledger_tool.call_outcome(
                values, run_options=self._options, default_scope=self._default_scope()
            )
        except _TOLD as exc:
            return for_model(exc) or str(exc)
        return _answer(outcome)


def _answer(outcome: CallOutcome[Any]) -> Any:
    """What the agent reads for a call's outcome: its result, or, answered from an
    earlier turn's receipt, that it was already done (``earlier_turn_text``); the
    tool's own failure is raised, as CrewAI expects of a tool."""
    error = outcome.error
    if isinstance(error, _TOLD):  # a handler past its deadline
        return for_model(error) or str(error)
    if error is not None:
        raise error
    if outcome.from_earlier_turn:
        result = outcome.result
        text = (
            result if isinstance(result, str) else canonical_json(result, field="result").decode()
        )
        return earlier_turn_text(outcome, text)
    return outcome.result


def as_crewai_tool(
    tool: Tool[Any],
    *,
    name: str | None = None,
    description: str | None = None,
    wait_for_approval: bool = False,
) -> LedgerCrewTool:
    """A CrewAI ``BaseTool`` that runs ``tool`` through its ledger.

    ``name`` defaults to the ledger name with characters model providers
    refuse (``.``, spaces) replaced by ``_``; ``description`` to the
    function's docstring. A call that needs a person's approval answers the
    agent that it waits (``wait_for_approval=False``, the default: a crew
    cannot wait hours); ``True`` makes the run wait for the decision. The
    workflow is the tool's own or the ``ledger.workflow(...)`` around the crew's
    run. Calls are keyed by ``scope="turn"`` inside ``ledger.workflow(id,
    turn=...)`` (a crew has no turn of its own), else by the tool's scope;
    a tool's declared ``scope`` always wins. A call answered from an earlier
    turn's receipt says so (``earlier_turn_text``)."""
    if not isinstance(tool, Tool):
        raise EffectLedgerValidationError(
            f"as_crewai_tool takes a ledger tool (from @ledger.tool), got {tool!r}", field="tool"
        )
    refuse_names(tool, "CrewAI")
    args = [arg for arg in arguments(tool) if arg.name != tool.context_parameter]
    fields: dict[str, Any] = {
        arg.name: (arg.annotation, ... if arg.default is REQUIRED else arg.default) for arg in args
    }
    # validate_default: a JSON default ("red" for an enum) becomes the object CrewAI's
    # model_dump() expects, as a sent value would.
    config = ConfigDict(
        extra="forbid", allow_inf_nan=False, arbitrary_types_allowed=True, validate_default=True
    )
    crew_name = name_for(tool.name) if name is None else name
    schema: type[BaseModel] = create_model(f"{crew_name}_args", __config__=config, **fields)
    to_json = JsonArguments(tool.name, {arg.name: arg.annotation for arg in args})
    text = _describe(tool) if description is None else description
    return _build(tool, crew_name, text, schema, to_json, wait_for_approval)


def wrap_crewai_tool(
    ledger: EffectLedger,
    base_tool: BaseTool,
    name: str | None = None,
    *,
    idempotency_keys: Sequence[str] | None = None,
    validate_keys: Sequence[str] | Literal["all"] | None = None,
    requires_approval: bool | Callable[[ToolCall], bool] | None = None,
    workflow_id: str | None = None,
    run_options: RunOptions | None = None,
    wait_for_approval: bool = False,
) -> LedgerCrewTool:
    """Register ``base_tool`` on ``ledger`` as a tool, and return the CrewAI tool that runs it.

    The ledger tool is named ``name`` (default: ``base_tool.name``; it is in
    every key, so keep it stable) and registered in ``ledger.tools``; the
    other keyword arguments are ``@ledger.tool``'s. Its arguments are
    ``base_tool``'s ``args_schema`` fields; each call runs
    ``base_tool.run(**arguments)`` (in a worker thread) once per key. Give
    the agent the returned tool instead of ``base_tool``: same name,
    description and schema.
    """
    if not isinstance(base_tool, BaseTool):
        raise EffectLedgerValidationError(
            f"wrap_crewai_tool takes a CrewAI BaseTool, got {base_tool!r}", field="base_tool"
        )
    schema = base_tool.args_schema
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        raise EffectLedgerValidationError(
            f"CrewAI tool {base_tool.name!r} has no pydantic args_schema to build a key from",
            field="base_tool",
        )
    refuse_factories(schema, f"CrewAI tool {base_tool.name!r}", "CrewAI", "base_tool")
    parameters = [
        inspect.Parameter(
            field_name,
            inspect.Parameter.KEYWORD_ONLY,
            default=REQUIRED if field.is_required() else field.get_default(),
        )
        for field_name, field in schema.model_fields.items()
    ]

    def run_crewai_tool(**arguments: Any) -> Any:
        # A plain function: the ledger runs it in a worker thread, where the
        # CrewAI tool's own run() (which may start an event loop) is safe.
        return base_tool.run(**arguments)

    dressed(
        run_crewai_tool,
        name_for(base_tool.name),
        base_tool.description,
        inspect.Signature(parameters),
    )
    tool: Tool[Any] = ledger.tool(
        base_tool.name if name is None else name,
        idempotency_keys=idempotency_keys,
        validate_keys=validate_keys,
        requires_approval=requires_approval,
        workflow_id=workflow_id,
        run_options=run_options,
    )(run_crewai_tool)
    to_json = JsonArguments(
        base_tool.name, {n: f.annotation for n, f in schema.model_fields.items()}
    )
    return _build(tool, base_tool.name, base_tool.description, schema, to_json, wait_for_approval)


def _build(
    tool: Tool[Any],
    name: str,
    text: str,
    schema: type[BaseModel],
    to_json: Callable[[Mapping[str, Any], str], dict[str, Any]],
    wait_for_approval: bool,
) -> LedgerCrewTool:
    crew_tool = LedgerCrewTool(name=name, description=text, args_schema=schema)
    crew_tool._ledger_tool = tool
    crew_tool._to_json = to_json
    crew_tool._options = None if wait_for_approval else RunOptions(wait_for_approval=False)
    return crew_tool


def _describe(tool: Tool[Any]) -> str:
    return description(tool) or f"Runs {tool.name} (recorded by agent-ledger)."
