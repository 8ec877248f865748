"""Tool.approval_policy / EffectLedger.approval_policy: who must approve, asked before a call."""

from __future__ import annotations

import pytest

from agent_ledger import (
    ApprovalPendingError,
    EffectLedgerValidationError,
    EffectStatus,
    LedgerHooks,
    MemoryStore,
    RunOptions,
    ToolCall,
)
from agent_ledger.testing import build_ledger


def _big(call: ToolCall) -> bool:
    amount = call.args["amount"]
    return isinstance(amount, int) and amount > 100


def test_a_tool_without_any_policy_needs_no_approval() -> None:
    """No option, no hook, anywhere: False, so a framework need not ask per call."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("t")
    async def t(amount: int) -> None: ...

    assert t.approval_policy is False
    assert ledger.approval_policy() is False


def test_requires_approval_true_on_the_tool_or_the_ledger_means_every_call() -> None:
    """A bool on the tool, or the ledger's default RunOptions, answers for every call."""
    ledger = build_ledger(MemoryStore())

    @ledger.tool("always", requires_approval=True)
    async def always(amount: int) -> None: ...

    @ledger.tool("never", requires_approval=False)
    async def never(amount: int) -> None: ...

    assert always.approval_policy is True and never.approval_policy is False

    strict = build_ledger(MemoryStore(), defaults=RunOptions(requires_approval=True))

    @strict.tool("t")
    async def t(amount: int) -> None: ...

    @strict.tool("exempt", run_options=RunOptions(requires_approval=False))
    async def exempt(amount: int) -> None: ...

    assert t.approval_policy is True and exempt.approval_policy is False


async def test_a_policy_function_is_asked_per_call_as_a_run_asks_it() -> None:
    """The tool's function and the ledger's hook both count; the answer matches run()."""
    hooked = build_ledger(
        MemoryStore(), hooks=LedgerHooks(requires_approval=lambda c: c.tool == "deploy")
    )

    @hooked.tool("pay", requires_approval=_big)
    async def pay(amount: int) -> str:
        return "paid"

    @hooked.tool("deploy")
    async def deploy(amount: int) -> str:
        return "deployed"

    pay_policy, deploy_policy = pay.approval_policy, deploy.approval_policy
    assert callable(pay_policy) and callable(deploy_policy)
    async with hooked.workflow("w"):
        small, big = pay.tool_call(5), pay.tool_call(500)
        assert pay_policy(small) is False and pay_policy(big) is True
        assert deploy_policy(deploy.tool_call(1)) is True
        # run() agrees: the small call runs, the big one and the deploy wait.
        no_wait = RunOptions(wait_for_approval=False)
        assert await pay.invoke({"amount": 5}, run_options=no_wait) == "paid"
        for tool, amount in ((pay, 500), (deploy, 1)):
            with pytest.raises(ApprovalPendingError):
                await tool.invoke({"amount": amount}, run_options=no_wait)
            key = hooked.idem_key(tool.tool_call(amount))
            effect = await hooked.find_by_idem_key(key)
            assert effect is not None and effect.status is EffectStatus.REQUIRES_APPROVAL


def test_hooks_of_the_wrong_type_are_refused() -> None:
    """approval_policy checks its arguments as run() does."""
    ledger = build_ledger(MemoryStore())
    with pytest.raises(EffectLedgerValidationError, match="LedgerHooks"):
        ledger.approval_policy(hooks="no")  # type: ignore[arg-type]
    with pytest.raises(EffectLedgerValidationError, match="RunOptions"):
        ledger.approval_policy("no")  # type: ignore[arg-type]
