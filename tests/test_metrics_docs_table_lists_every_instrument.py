"""docs/guide.md's metrics table is agent_ledger.metrics.INSTRUMENTS: every instrument,
its kind, unit and attributes, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from agent_ledger import metrics

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"
ROW = re.compile(
    r"^\| `(agent_ledger\.[a-z_.]+)` \| ([a-z -]+) \| `([^`]+)` \| ([a-z, ]+) \|", re.M
)
#: The table's short names for the attribute keys.
SHORT = {
    "tool": metrics.TOOL,
    "channel": metrics.CHANNEL,
    "action": metrics.ACTION,
    "reason": metrics.REASON,
    "outcome": metrics.OUTCOME,
}


def test_the_guide_documents_every_instrument_as_recorded() -> None:
    documented = [
        (
            name,
            kind.replace("-", "").replace(" ", ""),
            unit,
            tuple(SHORT[a] for a in attrs.split(", ")),
        )
        for name, kind, unit, attrs in ROW.findall(GUIDE.read_text())
    ]
    assert documented == [(i.name, i.kind, i.unit, i.attributes) for i in metrics.INSTRUMENTS]


def test_every_attribute_key_is_documented_in_the_guide() -> None:
    text = GUIDE.read_text()
    assert sorted(metrics.ATTRIBUTES) == sorted(SHORT.values())
    for key in metrics.ATTRIBUTES:
        assert f"`{key}`" in text
