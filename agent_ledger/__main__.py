"""``python -m agent_ledger``: the same as the ``agent-ledger`` command (try ``demo``)."""

from __future__ import annotations

import sys

from agent_ledger.cli import main

if __name__ == "__main__":
    sys.exit(main())
