"""``python -m agent_ledger demo``: see the ledger stop a duplicate payment."""

from __future__ import annotations

import argparse
import asyncio
import sys

from agent_ledger.demo import run_demo
from agent_ledger.stores.memory import MemoryStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent_ledger", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="an agent retries a payment 5 times; it is charged once")
    parser.parse_args(argv)
    api = asyncio.run(run_demo(MemoryStore()))
    return 0 if len(api.charges) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
