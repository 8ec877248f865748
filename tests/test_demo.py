"""The demo a new user runs first."""

from __future__ import annotations

import subprocess
import sys

from agent_ledger.demo import RETRIES, run_demo
from agent_ledger.stores.memory import MemoryStore


async def test_demo_charges_once_for_every_retry() -> None:
    """Five tries, one charge, one receipt showing four duplicates."""
    lines: list[str] = []
    api = await run_demo(MemoryStore(), lines.append)
    assert len(api.charges) == 1
    text = "\n".join(lines)
    assert text.count("charged the card") == 1
    assert text.count("replayed the receipt") == RETRIES - 1
    assert "charged once for 5 tries" in text
    assert "duplicates  4" in text


def test_demo_command_runs() -> None:
    """`python -m agent_ledger demo` exits 0 and prints the receipt."""
    done = subprocess.run(
        [sys.executable, "-m", "agent_ledger", "demo"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "The payment API was charged once" in done.stdout
    assert "status  succeeded" in done.stdout
