"""Human-readable receipts: how an effect is shown to a person."""

from __future__ import annotations

import orjson

from agent_ledger.effects import Effect


def render_receipt(effect: Effect) -> str:
    """A multi-line, aligned description of one effect, for terminals and logs."""
    duration = (
        f"{(effect.completed_at - effect.created_at).total_seconds() * 1000:.1f} ms"
        if effect.completed_at is not None
        else "-"
    )
    outcome = (
        orjson.dumps(effect.result).decode() if effect.error is None else f"error: {effect.error}"
    )
    rows = [
        ("effect", effect.id),
        ("idem key", effect.idem_key),
        ("workflow", effect.workflow_id),
        ("tool", effect.tool),
        ("call id", effect.call_id or "-"),
        ("status", effect.status.value),
        ("args", effect.args_canonical),
        ("resource", effect.resource_id_canonical or "-"),
        ("outcome", outcome),
        ("attempts", str(effect.attempt)),
        ("duplicates", str(effect.dedup_count)),
        ("created", effect.created_at.isoformat(timespec="milliseconds")),
        (
            "completed",
            effect.completed_at.isoformat(timespec="milliseconds") if effect.completed_at else "-",
        ),
        ("duration", duration),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.rjust(width)}  {value}" for label, value in rows)
