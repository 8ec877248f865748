"""The console's workflow page is the workflow's timeline: its effects, its model
calls with usage and cost, and its saga's steps (each with its compensation), in
the order they were recorded."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from agent_ledger import EffectLedger, EffectLedgerOptions, SqliteStore
from agent_ledger.console import StaticUsers, ToolPatterns, create_app, hash_password
from agent_ledger.effects import Usage
from agent_ledger.sagas import SagaFailed
from agent_ledger.tools import LLMResult

AUTH = httpx.BasicAuth("alice", "pw")


def _rows(html: str) -> list[str]:
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)
    return [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", r)).strip() for r in rows]


async def test_the_timeline_lists_effects_model_calls_and_saga_steps_in_order(
    tmp_path: Path,
) -> None:
    ledger = EffectLedger(EffectLedgerOptions(store=SqliteStore(tmp_path / "ledger.db")))

    @ledger.tool("reserve", compensate="release")
    async def reserve(item: str) -> str:
        return f"held {item}"

    @ledger.tool("release")
    async def release(forward: object) -> None:
        return None

    @ledger.tool("ship", compensate="unship")
    async def ship(item: str) -> str:
        raise RuntimeError("carrier down")

    @ledger.tool("unship")
    async def unship(forward: object) -> None:
        return None

    async def model(request: object) -> LLMResult:
        return LLMResult({"plan": "reserve then ship"}, Usage(120, 30))

    try:
        with pytest.raises(SagaFailed):
            async with ledger.saga("order-9"):
                await ledger.llm(
                    model,
                    provider="fake",
                    model="m1",
                    request={"q": "plan"},
                    pricing=lambda provider, name, usage: 0.0125,
                )
                await reserve("sku-1")
                await ship("sku-1")
        app = create_app(
            ledger,
            authenticate=StaticUsers({"alice": hash_password("pw")}),
            authorize=ToolPatterns({"alice": ["*"]}),
            secret=b"s" * 32,
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c.test") as client:
            page = await client.get("/workflows/order-9", auth=AUTH)
        assert page.status_code == 200
        assert "Saga: compensated" in page.text
        rows = _rows(page.text)
        assert len(rows) == 3, rows
        assert "model call" in rows[0] and "120 in / 30 out, $0.0125" in rows[0]
        assert "saga step 1 reserve undo: release (succeeded) succeeded" in rows[1]
        assert "saga step 2 ship" in rows[2] and "failed" in rows[2]
        assert "unship (not run)" in rows[2]  # a failed step is undone only if "attempted"
    finally:
        await ledger.store.close()
