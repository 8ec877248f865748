"""The PostgreSQL page's role commands (docs/postgres.md, "Roles") run as
written, with this session's schema and role names in place of the page's
(roles are shared by the whole server), and leave the logins able to work
and to decide as the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from agent_ledger.stores._postgres_roles import DEFAULT_ROLE_PREFIX
from tests.harness import DSN, require_postgres

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```bash\n(.*?)^```$", flags=re.M | re.S)


def _role_blocks() -> list[str]:
    text = (ROOT / "docs" / "postgres.md").read_text()
    section = text[text.index("## Roles") :]
    return [b for b in FENCE.findall(section) if "--roles" in b or "GRANT " in b]


def test_the_pages_role_commands_make_working_logins() -> None:
    require_postgres()
    blocks = _role_blocks()
    assert len(blocks) == 2, "init --roles, then the logins"
    suffix = uuid.uuid4().hex[:8]
    schema, prefix = f"agent_ledger_page_{suffix}", f"al_{suffix}_"
    logins = {"billing_agent": f"al_{suffix}_billing", "approvals_console": f"al_{suffix}_console"}

    def ours(block: str) -> str:
        block = block.replace("schema=agent_ledger", f"schema={schema}")
        block = block.replace("--roles", f"--roles --role-prefix {prefix}")
        block = block.replace(DEFAULT_ROLE_PREFIX, prefix)
        for name, login in logins.items():
            block = block.replace(name, login)
        return block

    env = {k: v for k, v in os.environ.items() if k != "AGENT_LEDGER_URL"}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["DATABASE_URL"] = DSN
    try:
        for block in blocks:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", ours(block)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
        with psycopg.connect(DSN, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_has_role(%s, %s, 'MEMBER'), pg_has_role(%s, %s, 'MEMBER'),"
                " pg_has_role(%s, %s, 'MEMBER')",
                (
                    logins["billing_agent"],
                    prefix + "worker",
                    logins["approvals_console"],
                    prefix + "approver",
                    logins["billing_agent"],
                    prefix + "approver",
                ),
            ).fetchone()
        assert rows == (True, True, False)
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            for role in [
                *logins.values(),
                prefix + "owner",
                prefix + "worker",
                prefix + "approver",
            ]:
                if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
