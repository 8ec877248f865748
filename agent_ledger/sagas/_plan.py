"""``ledger.run_saga(id, plan)``: a saga whose steps a model decided.

A plan is a list; each item is one step, ``{"tool": name, "args": {...}}``,
or a list of such steps, which is a parallel group. Tools are looked up by
name in the ledger's registry. The whole plan is checked before anything is
stored or run (every tool known, every argument bound, every compensation
registered), so a bad plan fails with one clear error naming the step, and
the saga does not even exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from agent_ledger.calls import ToolCall
from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.sagas._compensation import check_compensation_tool
from agent_ledger.sagas._saga import Saga
from agent_ledger.tools import Tool

if TYPE_CHECKING:
    from agent_ledger.tools import ToolLedger

#: One checked step: the tool and its arguments by name.
_Step = tuple[Tool[Any], Mapping[str, object]]
_KEYS = frozenset({"tool", "args"})


def check_plan(
    ledger: ToolLedger, plan: object, *, saga_id: str | None = None
) -> list[_Step | list[_Step]]:
    """The plan's steps, checked; raise ``EffectLedgerValidationError`` naming the
    first bad step (``step 3``, ``step 2.1`` inside a group). A compensable tool
    pinned to a workflow other than ``saga_id`` is refused: a saga undoes only
    effects keyed under its own id (see ``Saga._check_workflow``)."""
    if isinstance(plan, (str, bytes, Mapping)) or not isinstance(plan, Sequence) or not plan:
        raise EffectLedgerValidationError(
            "a saga plan is a non-empty list of steps ({'tool': name, 'args': {...}}) and "
            f"lists of steps (parallel groups); got {plan!r}. Nothing was run.",
            field="plan",
        )
    checked: list[_Step | list[_Step]] = []
    for i, item in enumerate(plan, start=1):
        if isinstance(item, Sequence) and not isinstance(item, (str, bytes)):
            if not item:
                raise _bad(f"step {i}", "a parallel group needs at least one step")
            checked.append(
                [_step(ledger, f"step {i}.{j}", s, saga_id) for j, s in enumerate(item, 1)]
            )
        else:
            checked.append(_step(ledger, f"step {i}", item, saga_id))
    return checked


def _step(ledger: ToolLedger, where: str, item: object, saga_id: str | None) -> _Step:
    if not isinstance(item, Mapping) or "tool" not in item or not set(item) <= _KEYS:
        raise _bad(where, f"expected {{'tool': name, 'args': {{...}}}}, got {item!r}")
    name = item["tool"]
    tool = ledger.tools.get(name) if isinstance(name, str) else None
    if tool is None:
        known = ", ".join(sorted(ledger.tools)) or "none"
        raise _bad(where, f"no tool named {name!r} is registered (known: {known})")
    pinned = tool.workflow_id
    if tool.compensate is not None and pinned is not None and pinned != saga_id:
        raise _bad(
            where,
            f"tool {name!r} is compensated but pinned to workflow {pinned!r}: its effect would "
            "be shared with every other caller of that workflow, and a saga only undoes "
            "effects keyed under its own id (register a tool without workflow_id for sagas)",
        )
    args = item.get("args", {})
    if not isinstance(args, Mapping):
        raise _bad(where, f"args must be a mapping of name to value, got {args!r}")
    try:
        values = tool.bind_arguments(args)
        # The key, made now: arguments that are not JSON (a set, NaN) or lack a
        # key field are refused with the rest of the plan, before the saga's
        # row exists (its id is not used up by a plan that cannot run). The
        # workflow is a stand-in: it changes the key, never what is checked.
        ledger.idem_key(
            ToolCall(
                workflow_id=tool.workflow_id or "plan-check",
                tool=tool.name,
                args=values,  # type: ignore[arg-type]  # checked as JSON by idem_key
                idempotency_keys=tool.idempotency_keys,
                validate_keys=tool.validate_keys,
            )
        )
        if tool.compensate is not None:
            check_compensation_tool(ledger, tool.name, tool.compensate)
    except EffectLedgerValidationError as exc:
        raise _bad(where, str(exc)) from exc
    return tool, args


def _bad(where: str, problem: str) -> EffectLedgerValidationError:
    return EffectLedgerValidationError(
        f"saga plan, {where}: {problem}. Nothing was run.", field="plan"
    )


async def run_saga(
    ledger: ToolLedger,
    saga_id: str,
    plan: Sequence[object],
    *,
    lease_ms: int | None = None,
    abandon_after: timedelta | None = None,
    on_compensation_failure: Literal["continue", "stop"] = "continue",
    owner: str | None = None,
) -> list[object]:
    """Run ``plan`` as saga ``saga_id``; the results in the plan's shape (a group's
    as a list). Raises like ``async with ledger.saga(...)``."""
    steps = check_plan(ledger, plan, saga_id=saga_id)
    saga = Saga(
        ledger,
        saga_id,
        lease_ms=lease_ms,
        abandon_after=abandon_after,
        on_compensation_failure=on_compensation_failure,
        owner=owner,
    )
    results: list[object] = []
    async with saga:
        for step in steps:
            if isinstance(step, list):
                async with saga.parallel():
                    tasks = [saga.start_invoke(tool, args) for tool, args in step]
                results.append([task.result() for task in tasks])
            else:
                tool, args = step
                results.append(await tool.invoke(args))
    return results
