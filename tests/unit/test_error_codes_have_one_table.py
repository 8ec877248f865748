"""Every error code the ledger records comes from ``agent_ledger.codes.ErrorCode``.

The codes are stored and matched on (by the adapters, the stores' parked
checks, applications), so a code typed again as a string where it is raised
could drift from the one matched. The package is read as source: a code may
appear as a string literal only in ``agent_ledger/codes.py``.
"""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent_ledger.codes import ErrorCode
from agent_ledger.effects import Effect, EffectError
from agent_ledger.errors import HANDLER_TIMEOUT, HandlerTimeoutError, is_handler_timeout
from agent_ledger.retries import RETRIES_EXHAUSTED
from agent_ledger.status import AMBIGUOUS_ATTEMPT, EffectStatus
from agent_ledger.stores.saga_base import SagaStatus

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agent_ledger"
TABLE = PACKAGE / "codes.py"
#: Status values are also spelled ``denied`` / ``canceled``; those literals are statuses.
STATUSES = {s.value for s in EffectStatus} | {s.value for s in SagaStatus}
#: Every code's stored spelling (computed once: the scan checks every literal).
CODES = frozenset(c.value for c in ErrorCode)
#: Names whose value is an error code, when compared with a literal.
CODE_NAMES = {"code", "error_code"}


def _sources() -> list[tuple[Path, ast.Module]]:
    return [
        (path, ast.parse(path.read_text(), filename=str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != TABLE
    ]


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"


def _is_code(node: ast.AST) -> bool:
    """``x.code``, ``code`` or ``error_code``: an expression holding an error code."""
    if isinstance(node, ast.Attribute):
        return node.attr in CODE_NAMES
    return isinstance(node, ast.Name) and node.id in CODE_NAMES


def _literal(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _typed_codes(path: Path, tree: ast.Module) -> list[str]:
    """Places that write a code as a string literal instead of naming an ``ErrorCode``."""
    found: list[str] = []
    # A dict's key is a field name (``{"abandoned": [...]}`` in a JSON report), not a code.
    nodes = list(ast.walk(tree))
    keys = {id(k) for d in nodes if isinstance(d, ast.Dict) for k in d.keys}
    for node in nodes:
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "EffectError":
            code = node.args[1] if len(node.args) > 1 else None
            code = next((k.value for k in node.keywords if k.arg == "code"), code)
            if _literal(code):
                found.append(f"{_where(path, node)}: EffectError(..., code literal)")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if not isinstance(item, ast.Assign | ast.AnnAssign):
                    continue
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                if any(_is_code(t) for t in targets) and _literal(item.value):
                    found.append(f"{_where(path, item)}: class {node.name} code literal")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_code(s) for s in sides) and any(_literal(s) for s in sides):
                found.append(f"{_where(path, node)}: a code compared with a literal")
        elif isinstance(node, ast.keyword) and node.arg in CODE_NAMES and _literal(node.value):
            found.append(f"{_where(path, node)}: {node.arg}= literal")
        elif (
            isinstance(node, ast.Constant)
            and id(node) not in keys
            and node.value in CODES
            and node.value not in STATUSES
        ):
            found.append(f"{_where(path, node)}: {node.value!r} typed again")
    return found


def test_the_scan_finds_codes_typed_as_literals() -> None:
    """The checks below are not vacuous: each shape of a typed code is caught."""
    sample = ast.parse(
        "EffectError('m', 'denied')\n"
        "EffectError(message='m', code='x')\n"
        "class E(Exception):\n    code = 'step_canceled'\n"
        "if effect.error.code == 'cancelled': pass\n"
        "f(error_code='ambiguous_attempt')\n"
        "LIMIT = 'handler_timeout'\n"
        "REPORT = {'abandoned': []}\n"
    )
    found = _typed_codes(PACKAGE / "sample.py", sample)
    lines = {int(place.split(":")[1]) for place in found}
    assert lines == {1, 2, 4, 5, 6, 7}, found


def test_no_module_types_a_code_outside_the_table() -> None:
    found = [place for path, tree in _sources() for place in _typed_codes(path, tree)]
    assert not found, "use agent_ledger.codes.ErrorCode instead:\n" + "\n".join(found)


def test_stored_spellings_never_change() -> None:
    """A code is data in every database already written: each member keeps its string."""
    assert {c.name: c.value for c in ErrorCode} == {
        "DENIED": "denied",
        "CANCELED": "canceled",
        "APPROVAL_EXPIRED": "expired",
        "AMBIGUOUS_ATTEMPT": "ambiguous_attempt",
        "RUN_CANCELLED": "cancelled",
        "HANDLER_TIMEOUT": "handler_timeout",
        "RETRIES_EXHAUSTED": "retries_exhausted",
        "TOO_MANY_TAKEOVERS": "too_many_takeovers",
        "RESULT_NOT_SERIALIZABLE": "result_not_serializable",
        "RESULT_TOO_LARGE": "result_too_large",
        "OUTCOME_NOT_STORED": "outcome_not_stored",
        "USAGE_NOT_SERIALIZABLE": "usage_not_serializable",
        "SAGA_ROLLED_BACK": "saga_rolled_back",
        "SAGA_ABANDONED": "abandoned",
        "STEP_CANCELED": "step_canceled",
    }


def test_every_code_says_when_it_is_recorded() -> None:
    for code in ErrorCode:
        assert code.when.strip() and "\n" not in code.when, code


def test_old_names_are_the_table_members() -> None:
    """Names that code imported before the table existed are its members."""
    assert HANDLER_TIMEOUT is ErrorCode.HANDLER_TIMEOUT
    assert RETRIES_EXHAUSTED is ErrorCode.RETRIES_EXHAUSTED
    assert AMBIGUOUS_ATTEMPT is ErrorCode.AMBIGUOUS_ATTEMPT


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_a_recorded_code_is_plain_text_equal_to_its_member(code: ErrorCode) -> None:
    """An ``EffectError`` keeps the code as a plain ``str`` (what every store writes
    and reads back), and it still compares equal to the member."""
    error = EffectError("m", code)
    assert type(error.code) is str
    assert error.code == code
    assert ErrorCode(error.code) is code


def test_a_handler_timeout_is_recognised_by_its_stored_code() -> None:
    """An effect read back from a store carries a plain string; matching still works."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    effect = Effect(
        id="00000000-0000-4000-8000-000000000001",
        idem_key="ab" * 32,
        workflow_id="wf",
        call_id=None,
        tool="psp.charge",
        status=EffectStatus.CANCELED,
        args_canonical="{}",
        resource_id_canonical=None,
        result=None,
        error=EffectError("cancelled after 5 ms (timeout_ms=3)", "handler_timeout"),
        dedup_count=0,
        attempt=1,
        created_at=now,
        updated_at=now,
        completed_at=now,
        heartbeat_at=now,
    )
    assert is_handler_timeout(effect)
    assert HandlerTimeoutError(effect).code == "handler_timeout"


def test_the_concepts_page_lists_every_code() -> None:
    """docs/concepts.md's table: every member, with its code and when it is recorded."""
    page = (ROOT / "docs" / "concepts.md").read_text()
    section = page.split("## Error codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| `([A-Z_]+)` \| (.+) \|$", section, flags=re.M)
    assert rows == [(c.value, c.name, c.when) for c in ErrorCode]
