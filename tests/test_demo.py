"""The demo a new user runs first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_demo_command_runs(tmp_path: Path) -> None:
    """`python -m agent_ledger demo` exits 0, prints the receipt and the rolled-back saga,
    and keeps them on disk."""
    env = {k: v for k, v in os.environ.items() if k != "AGENT_LEDGER_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "agent_ledger", "demo"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "The payment API was charged once" in done.stdout
    assert "status  succeeded" in done.stdout
    # Then the saga whose shipping fails, undone in reverse order.
    assert "what the services saw: charged, reserved, shipping failed, released, refunded" in (
        done.stdout
    )
    assert "saga order-2077: compensated" in done.stdout
    assert (tmp_path / "agent_ledger.db").exists()  # the embedded default store
