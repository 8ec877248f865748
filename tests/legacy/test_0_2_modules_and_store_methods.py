"""Every 0.2.x public name, module and store method either works as in 0.2.x (with a
warning where its spelling changed) or raises RemovedNameError naming what to use;
the migration guide lists each one (issue 26, item 10)."""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import pytest

import agent_ledger
from agent_ledger import EffectDeniedError, EffectFailedError, EffectStatus, MemoryStore, ToolCall
from agent_ledger.effects import CommitFailed, CommitSucceeded
from agent_ledger.legacy.names import MODULE_NAMES, STORE_METHODS, RemovedNameError
from agent_ledger.stores.base import Store
from tests.approvals import make_pending
from tests.harness import StoreHarness

GUIDE = Path(__file__).parents[2] / "docs" / "migrating-from-0.2.md"
ALL_NAMES = sorted({(m, n) for m, names in MODULE_NAMES.items() for n in names})


def _every_name_table() -> str:
    text = GUIDE.read_text()
    start = text.index("## Every 0.2.x name")
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize(("module", "name"), ALL_NAMES)
def test_every_0_2_name_works_or_says_what_to_use(module: str, name: str) -> None:
    imported = importlib.import_module(module)
    message = ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            value = getattr(imported, name)
    except RemovedNameError as gone:
        message, value = str(gone), None
    if message:
        assert message.startswith(f"{module}.{name} (agent-ledger 0.2.x) has no equivalent")
        assert message.endswith("see docs/migrating-from-0.2.md")
    else:
        assert value is not None


@pytest.mark.parametrize(("module", "name"), ALL_NAMES)
def test_the_migration_guide_lists_every_0_2_name(module: str, name: str) -> None:
    assert f"`{name}`" in _every_name_table()


@pytest.mark.parametrize("method", sorted(STORE_METHODS))
def test_the_migration_guide_lists_every_0_2_store_method(method: str) -> None:
    assert re.search(rf"`(?:[\w.]+\.)?{method}\b", _every_name_table())


def test_a_0_2_test_module_import_names_the_missing_name() -> None:
    """0.2.1's own tests start with this line; it used to be ModuleNotFoundError."""
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=r"import Effect as agent_ledger\.Effect"):
        exec("from agent_ledger.types import Effect", namespace)
    assert namespace["Effect"] is agent_ledger.Effect
    with (
        pytest.warns(DeprecationWarning, match="import Effect as"),
        pytest.raises(RemovedNameError, match=r"agent_ledger\.types\.UpsertEffectInput"),
    ):
        exec("from agent_ledger.types import Effect, UpsertEffectInput", {})


def test_utils_and_stores_modules() -> None:
    with pytest.warns(DeprecationWarning, match="agent_ledger.Store"):
        from agent_ledger.stores import EffectStore
    assert EffectStore is Store
    with pytest.raises(RemovedNameError, match=r"legacy\.keys\.jcs"):
        from agent_ledger.utils import canonicalize  # noqa: F401
    with pytest.warns(DeprecationWarning, match="idempotency_key"):
        from agent_ledger.utils import compute_idem_key
    call = ToolCall("wf", "t", {"a": 1})
    assert callable(compute_idem_key)
    assert compute_idem_key(call) == agent_ledger.EffectLedger(
        agent_ledger.EffectLedgerOptions(store=MemoryStore())
    ).idem_key(call)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        importlib.import_module("agent_ledger.types").nonsense  # noqa: B018
    # A submodule answers only for what 0.2.x's module of that name had.
    with pytest.raises(AttributeError, match="no attribute 'canonicalize'"):
        importlib.import_module("agent_ledger.stores").canonicalize  # noqa: B018


def test_idempotency_status_cites_a_page_that_exists() -> None:
    with pytest.raises(RemovedNameError) as gone:
        agent_ledger.IdempotencyStatus  # noqa: B018
    assert "docs/api.md" not in str(gone.value)
    assert "'fresh' or 'replayed'" in str(gone.value)
    for cited in re.findall(r"docs/[\w./-]+\.md", str(gone.value)):
        assert (GUIDE.parents[1] / cited).exists(), cited


async def test_0_2_store_methods_on_every_store(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    store = harness.store
    first = (await ledger.begin(ToolCall("wf", "first"))).effect
    await harness.age(10)
    second = (await ledger.begin(ToolCall("wf", "second"))).effect
    with pytest.warns(DeprecationWarning, match=r"use find\(idem_key\)"):
        found = await store.find_by_idem_key(first.idem_key)  # type: ignore[attr-defined]
    assert found == await store.find(first.idem_key)
    with pytest.warns(DeprecationWarning, match=r"use get\(effect_id\)"):
        by_id = await store.find_by_id(second.id)  # type: ignore[attr-defined]
    assert by_id == await store.get(second.id)
    with pytest.warns(DeprecationWarning, match=r"ledger\.list_effects"):
        everything = await store.list_effects()
    assert [e.id for e in everything] == [first.id, second.id]  # oldest first, as 0.2.x
    for method in ("upsert", "claim_for_processing", "increment_dedup_count"):
        with pytest.raises(RemovedNameError, match=rf"{type(store).__name__}\.{method} \(") as info:
            await getattr(store, method)(first.id, EffectStatus.PROCESSING)
        assert "ledger.begin" in str(info.value) or "begin() counts" in str(info.value)
    # 0.2.x's transition(effect_id, from_status, to_status, result=...) says what to use.
    shapes: list[tuple[tuple[object, ...], dict[str, object]]] = [
        ((first.id, EffectStatus.PROCESSING, EffectStatus.SUCCEEDED), {"result": {"ok": 1}}),
        ((first.id, EffectStatus.PROCESSING, EffectStatus.FAILED), {"error": {"message": "x"}}),
        ((first.id,), {"from_status": EffectStatus.PROCESSING, "to_status": EffectStatus.FAILED}),
    ]
    for args, kwargs in shapes:
        with pytest.raises(RemovedNameError, match=r"\.transition \(.*ledger\.commit|commit\("):
            await store.transition(*args, **kwargs)  # type: ignore[arg-type]
    # Nothing changed, and this version's own transition still answers.
    assert await store.find(first.idem_key) == found
    canceled = await store.transition(second.idem_key, target=EffectStatus.CANCELED)
    assert canceled is not None and canceled.status is EffectStatus.CANCELED


def test_memory_store_size_and_clear() -> None:
    store = MemoryStore()
    with pytest.warns(DeprecationWarning, match=r"len\(store\)"):
        assert store.size == 0
    with pytest.raises(RemovedNameError, match=r"MemoryStore\.clear \("):
        store.clear()


async def test_deny_takes_the_reason_by_position(harness: StoreHarness) -> None:
    ledger = harness.ledger()
    pending = await make_pending(ledger, ToolCall("wf", "refund", {"cents": 9}))
    assert await ledger.deny(pending.idem_key, "too large")
    with pytest.raises(EffectDeniedError, match="too large") as denied:
        await ledger.run(ToolCall("wf", "refund", {"cents": 9}), lambda effect: "ran")
    assert denied.value.reason == "too large"


def test_0_2_error_constructors_say_what_to_use() -> None:
    with pytest.raises(RemovedNameError, match=r"EffectFailedError\(effect\)"):
        EffectFailedError("key", {"code": "E", "message": "boom"})  # type: ignore[arg-type]
    with pytest.raises(RemovedNameError, match=r"EffectDeniedError\(effect\)"):
        EffectDeniedError("key", reason="no")  # type: ignore[arg-type]
    with pytest.raises(RemovedNameError, match=r"EffectDeniedError\(effect\)"):
        EffectDeniedError("key")  # type: ignore[arg-type]


async def test_errors_built_by_the_ledger_are_unchanged() -> None:
    ledger = agent_ledger.EffectLedger(agent_ledger.EffectLedgerOptions(store=MemoryStore()))
    begun = await ledger.begin(ToolCall("wf", "t"))
    assert await ledger.commit(
        begun.effect.id,
        CommitFailed(error=agent_ledger.EffectError("boom", "E")),
    )
    with pytest.raises(EffectFailedError) as failed:
        await ledger.run(ToolCall("wf", "t"), lambda effect: "x")
    assert (failed.value.message, failed.value.code) == ("boom", "E")
    assert not await ledger.commit(begun.effect.id, CommitSucceeded(result=1))
