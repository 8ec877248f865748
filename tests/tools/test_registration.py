"""Registering tools: names, signatures, options; checked before any call."""

from __future__ import annotations

import pytest

from agent_ledger import (
    Effect,
    EffectLedger,
    EffectLedgerValidationError,
    MemoryStore,
    RunOptions,
    ToolCall,
)
from agent_ledger.testing import build_ledger
from agent_ledger.tools import Tool


def _ledger() -> EffectLedger:
    return build_ledger(MemoryStore())


def test_default_name_is_the_module_qualified_function_name() -> None:
    """Without a name, the tool is called module.qualname."""
    ledger = _ledger()

    @ledger.tool()
    async def send(to: str) -> None: ...

    assert (
        send.name
        == f"{__name__}.test_default_name_is_the_module_qualified_function_name.<locals>.send"
    )
    assert ledger.tools[send.name] is send


def test_registering_a_name_twice_raises() -> None:
    """One name, one tool per ledger: the second registration is refused."""
    ledger = _ledger()

    @ledger.tool("mail.send")
    async def send(to: str) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="already registered"):

        @ledger.tool("mail.send")
        async def other(to: str) -> None: ...

    assert list(ledger.tools) == ["mail.send"] and ledger.tools["mail.send"] is send


def test_the_same_name_on_two_ledgers_is_fine() -> None:
    """Registries are per ledger."""
    for ledger in (_ledger(), _ledger()):

        @ledger.tool("mail.send")
        async def send(to: str) -> None: ...


def test_registry_is_read_only_and_holds_what_adapters_need() -> None:
    """ledger.tools maps names to Tool objects with the function, signature and options."""
    ledger = _ledger()

    def send(to: str, body: str = "", *, effect: Effect) -> str:
        return to

    tool = ledger.tool("mail.send", idempotency_keys=["to"], validate_keys="all")(send)
    assert isinstance(tool, Tool)
    assert (tool.name, tool.fn, tool.is_async) == ("mail.send", send, False)
    assert list(tool.signature.parameters) == ["to", "body", "effect"]
    assert (tool.idempotency_keys, tool.validate_keys) == (("to",), "all")
    with pytest.raises(TypeError):
        ledger.tools["x"] = tool  # type: ignore[index]


@pytest.mark.parametrize(
    "define",
    [
        lambda: lambda *args: None,
        lambda: lambda **kwargs: None,
    ],
    ids=["*args", "**kwargs"],
)
def test_variadic_parameters_are_refused(define) -> None:  # type: ignore[no-untyped-def]
    """*args/**kwargs have no names to key on: refused when registered."""
    with pytest.raises(EffectLedgerValidationError, match="not supported"):
        _ledger().tool("t")(define())


def test_effect_must_be_keyword_only() -> None:
    """A positional `effect` parameter would be ambiguous: refused."""

    async def send(to: str, effect: Effect) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="keyword-only"):
        _ledger().tool("t")(send)


@pytest.mark.parametrize("option", ["idempotency_keys", "validate_keys"])
def test_key_options_must_name_parameters(option: str) -> None:
    """idempotency_keys and validate_keys naming no parameter are refused."""

    async def send(to: str, *, effect: Effect) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match=r"\['body'\]"):
        _ledger().tool("t", **{option: ["body"]})(send)  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError):
        _ledger().tool("t", **{option: ["effect"]})(send)  # type: ignore[arg-type]


def test_non_json_default_is_refused_at_registration() -> None:
    """A default that could never be part of a key fails early."""

    async def send(to: object = object()) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="default"):
        _ledger().tool("t")(send)


def test_bare_decorator_without_parentheses_is_explained() -> None:
    """@ledger.tool without () gets a message saying to add them."""

    async def send(to: str) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="parentheses"):
        _ledger().tool(send)  # type: ignore[arg-type]


def test_async_approval_policy_is_refused() -> None:
    """requires_approval must answer synchronously, like LedgerHooks.requires_approval."""

    async def policy(call: ToolCall) -> bool:
        return True

    async def send(to: str) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="async def"):
        _ledger().tool("t", requires_approval=policy)(send)  # type: ignore[arg-type]


def test_requires_approval_given_twice_is_refused() -> None:
    """A bool requires_approval and run_options setting it too conflict."""

    async def send(to: str) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="twice"):
        _ledger().tool(
            "t", requires_approval=True, run_options=RunOptions(requires_approval=False)
        )(send)


def test_bad_workflow_id_at_registration_is_refused() -> None:
    """A pinned workflow id is checked like any other."""

    async def send(to: str) -> None: ...

    with pytest.raises(EffectLedgerValidationError, match="workflow_id"):
        _ledger().tool("t", workflow_id="  ")(send)


def test_attributes_of_the_function_never_overwrite_the_tool() -> None:
    """A function carrying a `name` (or `ledger`, ...) attribute keeps the tool's own."""
    ledger = _ledger()

    def charge(x: int) -> int:
        return x

    charge.name = "shared"  # type: ignore[attr-defined]
    charge.workflow_id = "other"  # type: ignore[attr-defined]
    tool = ledger.tool("payments.charge")(charge)
    assert tool.name == "payments.charge" and tool.workflow_id is None
    assert getattr(tool, "__wrapped__", None) is charge
    assert getattr(tool, "__name__", None) == "charge"


def test_a_tool_cannot_be_registered_again_as_a_tool() -> None:
    ledger, other = _ledger(), _ledger()

    @ledger.tool("inner")
    def f(x: int) -> int:
        return x

    with pytest.raises(EffectLedgerValidationError, match="already a tool"):
        other.tool("outer")(f)


def test_a_callable_without_a_qualified_name_needs_one() -> None:
    import functools

    ledger = _ledger()

    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(EffectLedgerValidationError, match="give the tool its name"):
        ledger.tool()(functools.partial(add, 1))
    assert ledger.tool("add1")(functools.partial(add, 1)).name == "add1"


def test_an_awaitable_tool_policy_is_refused_when_asked() -> None:
    import asyncio

    ledger = _ledger()

    async def later(call: object) -> bool:
        return False

    @ledger.tool("t", workflow_id="w", requires_approval=lambda call: later(call))  # type: ignore[arg-type,return-value]
    async def t() -> int:
        return 1

    with pytest.raises(EffectLedgerValidationError, match="returning a bool"):
        asyncio.run(t())
