"""A function wrapped once as a ledger tool: every call is one ``ledger.run()``.

Everything that can be decided about a tool is decided when it is
registered: its name, how arguments bind, which options and hooks its runs
use, whether it gets the ``effect``. A call then only binds its arguments,
finds its workflow and builds a ``ToolCall``, so the wrapper costs little
over a hand-written ``ledger.run()``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    Literal,
    Protocol,
    TypeAlias,
    TypeVar,
    cast,
    get_origin,
    overload,
    runtime_checkable,
)

from agent_ledger.budgets import Spend
from agent_ledger.calls import Scope, ToolCall, check_scope
from agent_ledger.context import (
    OutcomeSlot,
    budget_scopes,
    current_turn,
    current_workflow,
    enter_outcome_slot,
    exit_outcome_slot,
)
from agent_ledger.context import step_runner as _current_runner
from agent_ledger.effects import Effect
from agent_ledger.errors import (
    EffectFailedError,
    EffectLedgerValidationError,
    HandlerTimeoutError,
)
from agent_ledger.keys import canonical_json
from agent_ledger.options import UNSET, LedgerHooks, OnStale, RunOptions, merge_run_options
from agent_ledger.retries import Retryable, RetryPolicy, check_retryable
from agent_ledger.tools._budget import TOOL_UNITS, gate, open_budgets, tool_charge
from agent_ledger.tools._outcome import CallOutcome

if TYPE_CHECKING:
    from agent_ledger.core import LedgerCore

__all__ = [
    "EFFECT_PARAMETER",
    "StepRunner",
    "Tool",
    "ToolDecorator",
    "ToolLedger",
    "define",
    "step_runner",
]

#: The ledger as this layer and the ones above see it: the core
#: (``agent_ledger.core``) with its registry holding ``Tool``s. Never the
#: ``EffectLedger`` facade, which is built on these layers.
ToolLedger: TypeAlias = "LedgerCore[Tool[Any]]"

CompensateIf = Literal["succeeded", "attempted"]
FailureScope = Literal["saga", "step"]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

#: The keyword-only parameter through which a tool receives its ``Effect``.
EFFECT_PARAMETER: Final = "effect"

_P = inspect.Parameter
_POSITIONAL: Final = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)


@runtime_checkable
class StepRunner(Protocol):
    """Where a tool call goes when it is a step of something above this layer.

    A saga (``agent_ledger.sagas``) makes every tool call inside its block a
    step: recorded before its effect begins, undone if a later step fails.
    This layer cannot import it, so the saga makes itself the context's step
    runner (``agent_ledger.context.set_step_runner``) and ``Tool.__call__``
    and ``invoke`` hand their run to it (:func:`step_runner`). asyncio copies
    the context into tasks started inside, as with workflows.
    """

    @property
    def ledger(self) -> LedgerCore[object]:
        """The ledger whose calls it runs as steps."""
        ...

    async def run_step(
        self,
        tool: Tool[object],
        call: ToolCall,
        handler: Callable[[Effect], object],
        run_options: RunOptions | None,
        hooks: LedgerHooks | None,
    ) -> object:
        """Run one tool call as a step; return what ``ledger.run()`` would."""
        ...


def step_runner(ledger: object) -> StepRunner | None:
    """The step runner of ``ledger``'s calls made here (a saga of that ledger), or None.

    The context keeps it as ``object`` (it cannot name this layer's types);
    only a ``StepRunner`` is ever put there, and this is where it is known
    as one."""
    runner = _current_runner()
    if runner is None or not isinstance(runner, StepRunner) or runner.ledger is not ledger:
        return None
    return runner


class ToolDecorator(Protocol):
    """What ``ledger.tool(...)`` returns: give it the function, get the ``Tool``."""

    @overload
    def __call__(self, fn: Callable[..., Awaitable[R]], /) -> Tool[R]: ...

    @overload
    def __call__(self, fn: Callable[..., R], /) -> Tool[R]: ...


class Tool(Generic[R_co]):
    """A registered tool: call it (and await it) like the function it wraps.

    ``await tool(*args, **kwargs)`` binds the arguments to the function's
    signature (defaults filled in), so positional and keyword spellings of
    one call are one effect, and runs the function through ``ledger.run()``
    once per idempotency key in the current workflow. It returns the
    function's value (a replay: the stored JSON, where a tuple comes back as
    a list) and raises what the function raised (a replay of a failure:
    ``EffectFailedError``). Bad arguments raise ``EffectLedgerValidationError``
    before anything is stored.

    The attributes are what adapters and sagas need: ``name``, ``fn``,
    ``signature`` (the function's, ``effect`` included), and the options it
    was registered with.
    """

    def __init__(
        self,
        ledger: ToolLedger,
        fn: Callable[..., Any],
        name: str,
        *,
        idempotency_keys: Sequence[str] | None,
        validate_keys: Sequence[str] | Literal["all"] | None,
        requires_approval: bool | Callable[[ToolCall], bool] | None,
        workflow_id: str | None,
        run_options: RunOptions | None,
        compensate: str | None = None,
        compensate_if: CompensateIf = "succeeded",
        failure_scope: FailureScope = "saga",
        scope: Scope | None = None,
    ) -> None:
        # First, and without merging fn.__dict__ into ours: attributes the
        # function carries (a `name`, say) must never overwrite the tool's.
        functools.update_wrapper(self, fn, updated=())
        self.ledger = ledger
        self.fn = fn
        self.name = name
        self.signature = inspect.signature(fn)
        self.idempotency_keys = None if idempotency_keys is None else tuple(idempotency_keys)
        self.validate_keys: tuple[str, ...] | Literal["all"] | None = (
            validate_keys
            if validate_keys is None or validate_keys == "all"
            else tuple(validate_keys)
        )
        self.requires_approval = requires_approval
        self.workflow_id = workflow_id
        self.run_options = run_options
        self.is_async = inspect.iscoroutinefunction(fn)
        #: In a saga: the tool that undoes a call of this one (by name), when
        #: to undo it, and whether its failure rolls the saga back ("saga")
        #: or is recorded and the saga goes on ("step"). See docs/sagas.md;
        #: checked by the saga layer when ``ledger.tool()`` registers the tool.
        self.compensate = compensate
        self.compensate_if: CompensateIf = compensate_if
        self.failure_scope: FailureScope = failure_scope
        #: What makes two calls of this tool the same call besides their
        #: arguments: ``"workflow"``, ``"turn"`` or ``"call"`` (see
        #: ``ToolCall.scope``). None: not declared, so the caller's default
        #: applies (an adapter's ``default_scope``), else ``"workflow"``.
        self.scope: Scope | None = None if scope is None else check_scope(scope)

        self._takes_effect = False
        positional: list[str] = []
        keywords: list[str] = []
        defaults: list[tuple[str, object, bool]] = []
        self._positional_only = 0
        #: The name of a leading run-context parameter (see ``context_parameter``), or None.
        self._context: str | None = None
        for index, param in enumerate(self.signature.parameters.values()):
            if index == 0 and param.kind in _POSITIONAL and _is_run_context(param.annotation):
                self._context = param.name
                continue
            if param.kind in (_P.VAR_POSITIONAL, _P.VAR_KEYWORD):
                raise EffectLedgerValidationError(
                    f"tool {name!r}: *{param.name} and **{param.name} parameters are not "
                    "supported: a tool's arguments are its idempotency key, so each must "
                    "have a name. List them as parameters (or take one dict parameter).",
                    field="fn",
                )
            if param.name == EFFECT_PARAMETER:
                if param.kind is not _P.KEYWORD_ONLY:
                    raise EffectLedgerValidationError(
                        f"tool {name!r}: the effect parameter must be keyword-only "
                        "(`def f(a, *, effect: Effect)`): the ledger passes it, callers never do",
                        field="fn",
                    )
                self._takes_effect = True
                continue
            if param.kind in _POSITIONAL:
                positional.append(param.name)
                self._positional_only += param.kind is _P.POSITIONAL_ONLY
            if param.kind is not _P.POSITIONAL_ONLY:
                keywords.append(param.name)
            if param.default is not _P.empty:
                canonical_json(param.default, field=f"{name}({param.name}=...) default")
                # A mutable default (a list, a dict) is copied for each call, so
                # a function that changes it cannot change the next call's key.
                mutable = isinstance(param.default, (list, dict))
                defaults.append((param.name, param.default, mutable))
        self._names = (*positional, *(k for k in keywords if k not in positional))
        self._positional = tuple(positional)
        self._keywords = frozenset(keywords)
        self._defaults = tuple(defaults)
        self._check_names(self.idempotency_keys, "idempotency_keys")
        if self.validate_keys != "all":
            self._check_names(self.validate_keys, "validate_keys")

        positional_only = self._positional[: self._positional_only]
        self._make_handler = _handler_factory(
            fn, self.is_async, self._takes_effect, positional_only
        )
        self._make_handler_as = _handler_factory(
            fn, self.is_async, self._takes_effect, positional_only, recorded_later=False
        )
        self._run_options, self._hooks = _policy(ledger, name, requires_approval, run_options)
        # What calling the tool takes: the function's parameters less ``effect``,
        # which the ledger passes. ``inspect.signature(tool)`` reads this before
        # following ``__wrapped__`` to the function, so a framework that builds
        # a schema from the signature (pydantic-ai's ``Agent(tools=[tool])``)
        # never sees ``effect``: an ``Effect`` is no argument a model can send
        # (pydantic, asked for its schema, recursed for ever on its JSON type).
        self.__signature__ = self.signature.replace(
            parameters=[
                p
                for p in self.signature.parameters.values()
                if not (p.name == EFFECT_PARAMETER and p.kind is _P.KEYWORD_ONLY)
            ]
        )
        if workflow_id is not None:
            # Checked like any workflow id, once, here.
            ToolCall(workflow_id=workflow_id, tool=name)

    def _check_names(self, names: Sequence[str] | None, what: str) -> None:
        if names is None:
            return
        if isinstance(names, str):
            raise EffectLedgerValidationError(
                f"tool {self.name!r}: {what} must be a list of parameter names, got {names!r}",
                field=what,
            )
        unknown = [n for n in names if n not in self._names]
        if unknown or not names:
            raise EffectLedgerValidationError(
                f"tool {self.name!r}: {what} names {unknown or 'nothing'}; "
                f"its parameters are {list(self._names)}",
                field=what,
            )

    # -- a call ------------------------------------------------------------------------

    def bind(self, *args: object, **kwargs: object) -> dict[str, object]:
        """The call's arguments by name, defaults filled in: what the key is made of.

        Raises ``EffectLedgerValidationError`` for too many, unknown,
        repeated or missing arguments, as Python would (with a TypeError).
        """
        return self._bind(args, kwargs)

    def _bind(self, args: tuple[object, ...], kwargs: dict[str, object]) -> dict[str, object]:
        positional = self._positional
        if len(args) > len(positional):
            raise self._bad_call(
                f"takes {len(positional)} positional arguments but {len(args)} were given"
            )
        values = dict(zip(positional, args, strict=False)) if args else {}
        for key, value in kwargs.items():
            if key in values or key not in self._keywords:
                raise self._bad_keyword(key, values)
            values[key] = value
        if len(values) < len(self._names):
            for key, default, mutable in self._defaults:
                if key not in values:
                    values[key] = copy.deepcopy(default) if mutable else default
            if len(values) < len(self._names):
                missing = [n for n in self._names if n not in values]
                raise self._bad_call(f"missing required arguments {missing}")
        return values

    def tool_call(self, *args: object, **kwargs: object) -> ToolCall:
        """The ``ToolCall`` that ``await tool(*args, **kwargs)`` would run, here and now.

        Binds the arguments and reads the current workflow; raises like a call.
        """
        return self.call_of(self._bind(args, kwargs))

    def scope_for(self, scope: Scope | None = None, default_scope: Scope | None = None) -> Scope:
        """The scope a call of this tool is keyed by: the call's own ``scope``, else
        the tool's (``@ledger.tool(scope=...)``), else ``default_scope`` (an
        adapter's), else ``"workflow"``. Raises for a value that names no scope."""
        if scope is not None:
            return check_scope(scope)
        if self.scope is not None:
            return self.scope
        if default_scope is not None:
            return check_scope(default_scope, "default_scope")
        return "workflow"

    def call_of(
        self,
        values: dict[str, object],
        call_id: str | None = None,
        scope: Scope | None = None,
        default_scope: Scope | None = None,
    ) -> ToolCall:
        """The ``ToolCall`` for ``values`` already bound (by :meth:`bind` or
        :meth:`bind_arguments`), here and now: its workflow, turn and scope.

        For an adapter that binds a call once, then keys and runs it: binding
        again would drop what the framework injected beside the model's
        arguments. Raises ``EffectLedgerValidationError`` outside a workflow.
        """
        workflow_id = self.workflow_id or current_workflow()
        if workflow_id is None:
            raise EffectLedgerValidationError(
                f"tool {self.name!r} was called outside a workflow, so it has no key. "
                'Call it inside `async with ledger.workflow("<id>"):` (or `with`), or '
                f"register it with @ledger.tool(workflow_id=...). Nothing was stored.",
                field="workflow_id",
            )
        return ToolCall(
            workflow_id=workflow_id,
            tool=self.name,
            args=values,  # type: ignore[arg-type]  # checked as JSON when the key is made
            idempotency_keys=self.idempotency_keys,
            validate_keys=self.validate_keys,
            call_id=call_id,
            scope=self.scope_for(scope, default_scope),
            turn=current_turn(workflow_id),
        )

    async def __call__(self, *args: object, **kwargs: object) -> R_co:
        if self._context is not None:
            args, context = self._split_context(args, kwargs)
            values = self._bind(args, kwargs)
            handler = self._handler_with(context, values)
        else:
            values = self._bind(args, kwargs)
            handler = self._make_handler(values)
        call = self.call_of(values)
        # The function's R on a fresh run; on a replay its JSON (a tuple as a list).
        return cast(R_co, await self._run(call, handler, self._run_options))

    @property
    def context_parameter(self) -> str | None:
        """The name of the function's leading run-context parameter, or None.

        A function whose first parameter is annotated as pydantic-ai's
        ``RunContext`` (``def f(ctx: RunContext[Deps], to: str)``) gets the
        framework's context passed through: the caller gives it first (as
        pydantic-ai does), the function receives it, and it is never an
        argument of the call (not bound, not in the key, not recorded). A later
        attempt of the effect (after an approval, a takeover) gets the context
        of the call that runs it.
        """
        return self._context

    def _split_context(
        self, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[tuple[object, ...], object]:
        """The call's run context (first positional argument, or by its name) and the rest."""
        name = self._context
        assert name is not None
        if name in kwargs:
            return args, kwargs.pop(name)
        if args:
            return args[1:], args[0]
        raise self._bad_call(f"is missing its run context, the first argument {name!r}")

    def _handler_with(
        self, context: object, values: dict[str, object]
    ) -> Callable[[Effect], object]:
        """The run handler of a call whose function takes ``context`` first, outside the args."""
        positional_only = self._positional[: self._positional_only]
        bound = functools.partial(self.fn, context)
        return _handler_factory(bound, self.is_async, self._takes_effect, positional_only)(values)

    async def run_as(
        self,
        call: ToolCall,
        values: Mapping[str, object],
        *,
        run_options: RunOptions | None = None,
    ) -> object:
        """Run the function on ``values`` as the effect of ``call``, by the path every
        call of this tool takes (budgets in scope, a saga's steps, then
        ``ledger.run()`` with the tool's options and hooks; ``run_options`` go
        over the options, field by field).

        For a layer whose calls are not keyed by the function's arguments: a
        saga's compensation gets the forward ``Effect`` and is keyed by the
        forward effect's key. Every attempt runs on ``values``: the args
        recorded with the effect are the key's, not the function's.
        """
        handler = self._make_handler_as(dict(values))
        return await self._run(call, handler, self._options_over(run_options))

    async def _run(
        self, call: ToolCall, handler: Callable[[Effect], object], options: RunOptions | None
    ) -> object:
        """The one path of a call: budgets in scope, then a saga's step or ``ledger.run()``."""
        if budget_scopes():
            return await self._budgeted(call, handler, options)
        return await self._step_or_run(call, handler, options)

    async def _step_or_run(
        self, call: ToolCall, handler: Callable[[Effect], object], options: RunOptions | None
    ) -> object:
        runner = step_runner(self.ledger)
        if runner is not None:
            return await runner.run_step(self, call, handler, options, self._hooks)
        return await self.ledger.run(call, handler, options, hooks=self._hooks)

    def _options_over(self, run_options: RunOptions | None) -> RunOptions | None:
        """``run_options`` over the tool's own, field by field."""
        if run_options is None:
            return self._run_options
        if not isinstance(run_options, RunOptions):
            raise EffectLedgerValidationError(
                f"tool {self.name!r}: run_options must be a RunOptions, got "
                f"{type(run_options).__name__}. Nothing was stored.",
                field="run_options",
            )
        return merge_run_options(self._run_options or RunOptions(), run_options)

    async def _budgeted(
        self, call: ToolCall, handler: Callable[[Effect], object], options: RunOptions | None
    ) -> object:
        """The call under the budgets in scope: one tool call reserved before it runs
        (``BudgetExceededError`` if it does not fit), booked once if it executes."""
        scopes = await open_budgets(self.ledger)
        if not scopes:  # a workflow block whose workflow has no budget: the common case
            return await self._step_or_run(call, handler, options)
        run = functools.partial(self._step_or_run, call, handler, options)
        return await gate(
            self.ledger,
            scopes,
            idem_key=self.ledger.idem_key(call),
            tool=self.name,
            estimate=Spend(tool_calls=1),
            units=TOOL_UNITS,
            charge=tool_charge,
            run=run,
        )

    def sync(self, *args: object, **kwargs: object) -> R_co:
        """``await tool(*args, **kwargs)`` for sync code: blocks until the outcome.

        Runs on the ledger's loop (see ``EffectLedger.call_sync``), in the
        caller's context, so a ``with ledger.workflow(...)`` around the call
        applies. Same guarantees as the async call; raises, rather than
        stalling it, when called on a running event loop.
        """
        return self.ledger.call_sync(self.__call__, *args, **kwargs)

    def invoke_sync(
        self,
        arguments: Mapping[str, object],
        *,
        call_id: str | None = None,
        run_options: RunOptions | None = None,
        scope: Scope | None = None,
        default_scope: Scope | None = None,
    ) -> R_co:
        """``invoke`` for sync code (see ``sync``)."""
        return self.ledger.call_sync(
            self.invoke,
            arguments,
            call_id=call_id,
            run_options=run_options,
            scope=scope,
            default_scope=default_scope,
        )

    def call_outcome_sync(
        self,
        arguments: Mapping[str, object],
        *,
        call_id: str | None = None,
        run_options: RunOptions | None = None,
        scope: Scope | None = None,
        default_scope: Scope | None = None,
    ) -> CallOutcome[R_co]:
        """``call_outcome`` for sync code (see ``sync``)."""
        return self.ledger.call_sync(
            self.call_outcome,
            arguments,
            call_id=call_id,
            run_options=run_options,
            scope=scope,
            default_scope=default_scope,
        )

    def bind_arguments(self, arguments: Mapping[str, object]) -> dict[str, object]:
        """``bind`` for arguments by name (positional-only ones too), as ``invoke`` binds them.

        Raises ``EffectLedgerValidationError`` as ``bind`` does.
        """
        if not isinstance(arguments, Mapping):
            raise self._bad_call(
                f"takes its arguments as a mapping of name to value, got {type(arguments).__name__}"
            )
        kwargs = dict(arguments)
        leading: list[object] = []
        for name in self._positional[: self._positional_only]:
            if name not in kwargs:
                break  # _bind reports it missing (unless it has a default)
            leading.append(kwargs.pop(name))
        return self._bind(tuple(leading), kwargs)

    async def invoke(
        self,
        arguments: Mapping[str, object],
        *,
        call_id: str | None = None,
        run_options: RunOptions | None = None,
        scope: Scope | None = None,
        default_scope: Scope | None = None,
        context: object = None,
    ) -> R_co:
        """Run the tool with its arguments by name, as a model sends them: the adapters' door.

        ``arguments`` bind like keyword arguments (positional-only
        parameters included, by name), so it is the same effect as the
        equivalent ``await tool(...)``. ``call_id`` (a framework's tool-call
        id) is recorded on a new effect; it is part of the key only under
        ``scope="call"``. ``scope`` overrides the tool's for this call;
        ``default_scope`` (an adapter's default) applies when neither the
        call nor the tool declares one (see :meth:`scope_for`).
        ``run_options`` go over the tool's own, field by field (for example
        ``RunOptions(wait_for_approval=False)``). ``context`` is the run
        context a function with a ``context_parameter`` receives (never part
        of the arguments or the key).
        """
        options = self._options_over(run_options)
        values = self.bind_arguments(arguments)
        call = self.call_of(values, call_id, scope, default_scope)
        return cast(R_co, await self._run(call, self._handler_of(values, context), options))

    def _handler_of(self, values: dict[str, object], context: object) -> Callable[[Effect], object]:
        if self._context is None:
            return self._make_handler(values)
        return self._handler_with(context, values)

    def call_for(
        self,
        arguments: Mapping[str, object],
        *,
        call_id: str | None = None,
        scope: Scope | None = None,
        default_scope: Scope | None = None,
    ) -> ToolCall:
        """The ``ToolCall`` that ``invoke(arguments, ...)`` with these would run, here and
        now (its workflow, turn and scope); raises as the call would."""
        return self.call_of(self.bind_arguments(arguments), call_id, scope, default_scope)

    async def call_outcome(
        self,
        arguments: Mapping[str, object],
        *,
        call_id: str | None = None,
        run_options: RunOptions | None = None,
        scope: Scope | None = None,
        default_scope: Scope | None = None,
        context: object = None,
    ) -> CallOutcome[R_co]:
        """``invoke``, answered as a :class:`CallOutcome`: the result or the tool's
        failure, and whether the call ran now or was answered from a receipt
        (and from an earlier turn's), with the receipt's key and time.

        Raises what ``invoke`` raises for everything that is not the tool's own
        failure (a denial, a pending approval, a budget refusal, bad
        arguments, a store error): see ``CallOutcome``.
        """
        options = self._options_over(run_options)
        values = self.bind_arguments(arguments)
        call = self.call_of(values, call_id, scope, default_scope)
        slot = OutcomeSlot(self.ledger.idem_key(call))
        token = enter_outcome_slot(slot)
        try:
            result = await self._run(call, self._handler_of(values, context), options)
        except (EffectFailedError, HandlerTimeoutError) as exc:
            if exc is not slot.error and not (
                slot.replayed and exc.effect.idem_key == slot.idem_key
            ):
                raise
            return _outcome(call, slot, None, exc)
        except Exception as exc:
            if exc is not slot.error:
                raise
            return _outcome(call, slot, None, exc)
        finally:
            exit_outcome_slot(token)
        return _outcome(call, slot, cast(R_co, result), None)

    @property
    def approval_policy(self) -> bool | Callable[[ToolCall], bool]:
        """Which fresh calls of this tool wait for a person: the tool's policy and the ledger's.

        ``True`` (every call), ``False`` (none), or a function of the
        ``ToolCall`` (``tool.tool_call(...)``) asked per call, as a run asks
        it: the tool's ``requires_approval`` and ``run_options`` over the
        ledger's defaults and hooks (``EffectLedger.approval_policy``). For
        adapters whose framework asks before it calls; an effect that
        already exists keeps its own status.
        """
        return self.ledger.approval_policy(self._run_options, hooks=self._hooks)

    @property
    def run_settings(self) -> tuple[RunOptions | None, LedgerHooks | None]:
        """The run options and hooks each run of this tool gives ``ledger.run()``
        (its ``retry``, ``timeout_ms`` and approval policy folded in): for
        layers that run it their own way, as sagas run compensations."""
        return self._run_options, self._hooks

    @property
    def takes_effect(self) -> bool:
        """Whether the function has the keyword-only ``effect`` parameter."""
        return self._takes_effect

    def _bad_call(self, problem: str) -> EffectLedgerValidationError:
        return EffectLedgerValidationError(
            f"tool {self.name!r} {problem}; its parameters are {list(self._names)}. "
            "Nothing was stored.",
            field="args",
        )

    def _bad_keyword(self, key: str, values: dict[str, object]) -> EffectLedgerValidationError:
        if key == EFFECT_PARAMETER and self._takes_effect:
            return self._bad_call("got effect=..., which the ledger passes itself")
        if key in values:
            return self._bad_call(f"got multiple values for argument {key!r}")
        if key in self._names:
            return self._bad_call(f"got positional-only argument {key!r} as a keyword")
        return self._bad_call(f"got an unexpected keyword argument {key!r}")

    def __repr__(self) -> str:
        return f"<Tool {self.name!r} {self.signature}>"


def _is_run_context(annotation: object) -> bool:
    """Whether a parameter's annotation is pydantic-ai's ``RunContext`` (subscripted or
    not, as a class or as the text ``from __future__ import annotations`` leaves).

    Recognised by name, so this layer imports no framework: a class named
    ``RunContext`` from a ``pydantic_ai`` module, or text naming ``RunContext``.
    """
    if isinstance(annotation, str):
        return _RUN_CONTEXT_TEXT.fullmatch(annotation.strip()) is not None
    origin = get_origin(annotation) or annotation
    module = getattr(origin, "__module__", None)
    return (
        getattr(origin, "__name__", None) == "RunContext"
        and isinstance(module, str)
        and module.split(".")[0] == "pydantic_ai"
    )


_RUN_CONTEXT_TEXT: Final = re.compile(r"(?:[A-Za-z_][\w.]*\.)?RunContext(?:\[.*\])?", re.S)


def _outcome(
    call: ToolCall, slot: OutcomeSlot, result: R | None, error: BaseException | None
) -> CallOutcome[R]:
    """The ``CallOutcome`` of ``call``, from what the engine left in its slot."""
    effect = slot.effect
    replayed = slot.replayed
    effect_turn = None if effect is None else effect.turn
    earlier = replayed and call.turn is not None and effect_turn != call.turn
    retryable = slot.retryable if error is slot.error else bool(getattr(error, "retryable", False))
    return CallOutcome(
        result=result,
        replayed=replayed,
        from_earlier_turn=earlier,
        completed_at=effect.completed_at if replayed and effect is not None else None,
        idem_key=slot.idem_key if effect is None else effect.idem_key,
        effect_turn=effect_turn,
        turn=call.turn,
        error=error,
        retryable=retryable,
        effect=effect,
    )


def _handler_factory(
    fn: Callable[..., Any],
    is_async: bool,
    takes_effect: bool,
    positional_only: tuple[str, ...],
    *,
    recorded_later: bool = True,
) -> Callable[[dict[str, object]], Callable[[Effect], object]]:
    """How a call's bound args become its ``run()`` handler, decided once per tool.

    ``effect`` goes beside the args, never among them. An async function
    gets an ``async def`` handler, which ``run()`` awaits on the loop; a plain
    one a plain handler, which ``run()`` calls in a worker thread
    (``sync_handlers="thread"``, the default).

    The caller's own values run only on the effect's first attempt, which
    the call itself created. A later attempt (after an approval, or a
    takeover) runs the args recorded with the effect: the request a person
    approved, or the crashed worker made, not whatever a later caller with
    the same key (and other values of args outside ``idempotency_keys``)
    happened to pass. They come as JSON (a tuple as a list).
    """
    if positional_only:
        # Rare: split the positional-only args off per call. The ToolCall
        # keeps the bound args whole, since they are its key.
        def build(values: dict[str, object]) -> Callable[[Effect], object]:
            leading = [values[n] for n in positional_only if n in values]
            rest = {k: v for k, v in values.items() if k not in positional_only}
            bound = functools.partial(fn, *leading)
            return _handler_factory(bound, is_async, takes_effect, (), recorded_later=False)(rest)

        def split(values: dict[str, object]) -> Callable[[Effect], object]:
            own = build(values)
            return lambda effect: (own if effect.attempt == 1 else build(dict(effect.args)))(effect)

        return split if recorded_later else build
    if not recorded_later:
        if is_async and takes_effect:
            return lambda values: lambda effect: fn(**values, effect=effect)
        if takes_effect:
            return lambda values: lambda effect: fn(**values, effect=effect)
        return lambda values: lambda effect: fn(**values)
    if is_async and takes_effect:

        def make(values: dict[str, object]) -> Callable[[Effect], object]:
            async def handler(effect: Effect) -> object:
                args = values if effect.attempt == 1 else effect.args
                return await fn(**args, effect=effect)

            return handler

    elif is_async:

        def make(values: dict[str, object]) -> Callable[[Effect], object]:
            async def handler(effect: Effect) -> object:
                return await fn(**(values if effect.attempt == 1 else effect.args))

            return handler

    elif takes_effect:

        def make(values: dict[str, object]) -> Callable[[Effect], object]:
            return lambda effect: fn(
                **(values if effect.attempt == 1 else effect.args), effect=effect
            )

    else:

        def make(values: dict[str, object]) -> Callable[[Effect], object]:
            return lambda effect: fn(**(values if effect.attempt == 1 else effect.args))

    return make


def _policy(
    ledger: ToolLedger,
    name: str,
    requires_approval: bool | Callable[[ToolCall], bool] | None,
    run_options: RunOptions | None,
) -> tuple[RunOptions | None, LedgerHooks | None]:
    """The run options and hooks every run of this tool passes to ``ledger.run()``.

    A bool is ``RunOptions.requires_approval``; a callable is a policy hook
    asked alongside the ledger's own (either saying yes means approval), with
    the ledger's notification hook kept.
    """
    if run_options is not None and not isinstance(run_options, RunOptions):
        raise EffectLedgerValidationError(
            f"tool {name!r}: run_options must be a RunOptions, got {run_options!r}",
            field="run_options",
        )
    if requires_approval is None:
        return run_options, None
    if isinstance(requires_approval, bool):
        if run_options is not None and run_options.requires_approval is not UNSET:
            raise EffectLedgerValidationError(
                f"tool {name!r}: requires_approval is given twice (argument and run_options)",
                field="requires_approval",
            )
        if run_options is None:
            return RunOptions(requires_approval=requires_approval), None
        return replace(run_options, requires_approval=requires_approval), None
    if not callable(requires_approval):
        raise EffectLedgerValidationError(
            f"tool {name!r}: requires_approval must be a bool or a function of the "
            f"ToolCall, got {requires_approval!r}",
            field="requires_approval",
        )
    # Checked by LedgerHooks (an async def is refused) before it is wrapped.
    LedgerHooks(requires_approval=requires_approval)
    ledger_hooks = ledger.hooks
    ledger_policy = ledger_hooks.requires_approval
    tool_policy = requires_approval

    def policy(call: ToolCall) -> bool:
        said = tool_policy(call)
        if said is not False:
            # True, or not a bool at all (an awaitable, say), which the engine
            # refuses with the same error as for the ledger's own hook.
            return said
        return False if ledger_policy is None else ledger_policy(call)

    hooks = LedgerHooks(
        requires_approval=policy, on_approval_required=ledger_hooks.on_approval_required
    )
    return run_options, hooks


def _with_fields(
    name: str | None,
    run_options: RunOptions | None,
    *,
    retry: RetryPolicy | None,
    timeout_ms: int | None,
    on_stale: OnStale | None,
    retryable: Retryable | None = None,
) -> RunOptions | None:
    """A tool's ``retry=``, ``timeout_ms=``, ``on_stale=`` and ``retryable=`` are the
    ``RunOptions`` fields of those names; giving one both as an argument and in
    ``run_options`` is ambiguous. ``RunOptions`` checks the values."""
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise EffectLedgerValidationError(
            f"tool {name!r}: retry must be a RetryPolicy, got {retry!r}", field="retry"
        )
    if retryable is not None:
        check_retryable(retryable)
    given: dict[str, Any] = {
        key: value
        for key, value in (
            ("retry", retry),
            ("timeout_ms", timeout_ms),
            ("on_stale", on_stale),
            ("retryable", retryable),
        )
        if value is not None
    }
    if not given:
        return run_options
    if run_options is None:
        return RunOptions(**given)
    if not isinstance(run_options, RunOptions):
        return run_options  # _policy names the problem
    for key in given:
        if getattr(run_options, key) is not UNSET:
            raise EffectLedgerValidationError(
                f"tool {name!r}: {key} is given twice (argument and run_options)", field=key
            )
    return replace(run_options, **given)


def define(
    ledger: ToolLedger,
    registry: dict[str, Tool[Any]],
    name: str | None,
    *,
    idempotency_keys: Sequence[str] | None,
    validate_keys: Sequence[str] | Literal["all"] | None,
    requires_approval: bool | Callable[[ToolCall], bool] | None,
    workflow_id: str | None,
    run_options: RunOptions | None,
    retry: RetryPolicy | None = None,
    timeout_ms: int | None = None,
    compensate: str | None = None,
    compensate_if: CompensateIf = "succeeded",
    failure_scope: FailureScope = "saga",
    on_stale: OnStale | None = None,
    scope: Scope | None = None,
    retryable: Retryable | None = None,
) -> ToolDecorator:
    """``EffectLedger.tool``: the decorator that registers a function in ``registry``."""
    if callable(name):
        raise EffectLedgerValidationError(
            "ledger.tool takes the tool's name, not the function: write @ledger.tool() "
            "or @ledger.tool('name'), with parentheses",
            field="name",
        )
    if name is not None:
        ToolCall(workflow_id="-", tool=name)  # the checks any tool name gets
    if scope is not None:
        check_scope(scope)
    run_options = _with_fields(
        name,
        run_options,
        retry=retry,
        timeout_ms=timeout_ms,
        on_stale=on_stale,
        retryable=retryable,
    )

    def decorate(fn: Callable[..., Any]) -> Tool[Any]:
        if isinstance(fn, Tool):
            raise EffectLedgerValidationError(
                f"{fn!r} is already a tool (of its own ledger, under its own name); register "
                "the plain function instead: @ledger.tool applies once",
                field="fn",
            )
        if not callable(fn):
            raise EffectLedgerValidationError(
                f"ledger.tool decorates a function, got {fn!r}", field="fn"
            )
        if name is None:
            module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
            if not isinstance(module, str) or not isinstance(qualname, str):
                raise EffectLedgerValidationError(
                    f"{fn!r} has no module-qualified name to default to (a partial or a "
                    "callable object): give the tool its name, @ledger.tool('name')",
                    field="name",
                )
            tool_name = f"{module}.{qualname}"
        else:
            tool_name = name
        if tool_name in registry:
            raise EffectLedgerValidationError(
                f"a tool named {tool_name!r} is already registered on this ledger "
                f"({registry[tool_name].fn!r}); give each tool its own name: the name is "
                "part of every key its calls make",
                field="name",
            )
        tool: Tool[Any] = Tool(
            ledger,
            fn,
            tool_name,
            idempotency_keys=idempotency_keys,
            validate_keys=validate_keys,
            requires_approval=requires_approval,
            workflow_id=workflow_id,
            run_options=run_options,
            compensate=compensate,
            compensate_if=compensate_if,
            failure_scope=failure_scope,
            scope=scope,
        )
        registry[tool_name] = tool
        return tool

    return decorate
