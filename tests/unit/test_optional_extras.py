"""Framework SDKs are optional extras: `import agent_ledger` never needs or loads one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

FRAMEWORKS = ("openai", "anthropic", "langchain_core", "mcp", "agents", "pydantic")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_import_loads_no_framework() -> None:
    done = _python(
        f"""
        import sys
        import agent_ledger, agent_ledger.sync, agent_ledger.adapters
        from agent_ledger.adapters import _common
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r})
        print(loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_import_works_with_every_framework_missing() -> None:
    """With the SDKs made unimportable, the core still imports and runs a tool."""
    done = _python(
        f"""
        import sys
        for name in {FRAMEWORKS!r}:
            sys.modules[name] = None  # makes `import name` raise ImportError
        import asyncio
        from agent_ledger import EffectLedger, EffectLedgerOptions, MemoryStore

        ledger = EffectLedger(EffectLedgerOptions(store=MemoryStore()))

        @ledger.tool("t", workflow_id="w")
        async def t(x: int) -> int:
            return x + 1

        print(asyncio.run(t(1)))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
