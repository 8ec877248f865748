"""What the budget tests share: a flat price and the ledger's store as a BudgetStore."""

from __future__ import annotations

from agent_ledger import EffectLedger, Usage
from agent_ledger.stores.budget_base import BudgetStore


def price(provider: str, model: str, usage: Usage) -> float:
    """$1 per million tokens, input or output."""
    return (usage.input_tokens + usage.output_tokens) / 1_000_000


def budget_store(ledger: EffectLedger) -> BudgetStore:
    store = ledger.store
    assert isinstance(store, BudgetStore)
    return store
