"""CLI output: colour only when asked (a terminal), tables within 100 columns either way."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime

from agent_ledger import Effect, EffectStatus
from agent_ledger.cli import WIDTH, Output, effects_table

ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def effect(status: EffectStatus, tool: str = "t", workflow: str = "w") -> Effect:
    return Effect(
        id="00000000-0000-4000-8000-000000000000", idem_key="ab" * 32, workflow_id=workflow,
        call_id=None, tool=tool, status=status, args_canonical="{}", resource_id_canonical=None,
        result=None, error=None, dedup_count=0, attempt=1, created_at=NOW, updated_at=NOW,
        completed_at=None, heartbeat_at=NOW,
    )  # fmt: skip


def test_colour_marks_statuses_only_when_enabled() -> None:
    """On a terminal statuses are coloured; otherwise the output is plain text."""
    coloured, plain = io.StringIO(), io.StringIO()
    rows = [effect(s) for s in EffectStatus]
    effects_table(Output(coloured, colour=True), rows)
    effects_table(Output(plain, colour=False), rows)
    assert ANSI.search(coloured.getvalue())
    assert not ANSI.search(plain.getvalue())
    assert ANSI.sub("", coloured.getvalue()) == plain.getvalue()


def test_coloured_table_still_fits_in_the_width() -> None:
    """Escape codes take no columns: the visible table stays within WIDTH."""
    out = io.StringIO()
    effects_table(
        Output(out, colour=True), [effect(EffectStatus.REQUIRES_APPROVAL, "t" * 300, "w" * 300)]
    )
    assert all(len(ANSI.sub("", line)) <= WIDTH for line in out.getvalue().splitlines())
