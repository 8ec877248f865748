"""What the schema-upgrade tests share: the released version 1 schemas and the
version 1 histories they fill them with, each with what version 2 must make of it."""

from __future__ import annotations

from pathlib import Path
from typing import Final

FIXTURES: Final = Path(__file__).resolve().parent / "fixtures"
#: The schemas exactly as released at version 1.
POSTGRES_V1: Final = (FIXTURES / "postgres_schema_v1.sql").read_text(encoding="utf-8")
SQLITE_V1: Final = (FIXTURES / "sqlite_schema_v1.sql").read_text(encoding="utf-8")

#: (key, status, attempt, decided, expected executions, expected start) for a
#: version 1 row: every way an effect could have got where it is.
HISTORIES: Final = [
    ("ran-once", "succeeded", 1, False, 1, "created"),
    ("taken-over", "succeeded", 3, False, 3, "created"),
    ("approved-then-ran", "succeeded", 2, True, 1, "decided"),
    ("approved-then-failed", "failed", 2, True, 1, "decided"),
    ("running", "processing", 1, False, 1, "created"),
    ("waiting-for-a-person", "requires_approval", 1, False, 0, None),
    ("approved-not-run", "ready", 1, True, 0, None),
    ("denied", "denied", 1, True, 0, None),
    # A cancel records a decision whether or not a handler was running: the
    # estimate errs towards "it ran".
    ("canceled-while-waiting", "canceled", 1, True, 1, "created"),
    ("canceled-while-running", "canceled", 1, True, 1, "created"),
    ("canceled-after-approval", "canceled", 2, True, 2, "created"),
]


def executed_sql(sql_text: str) -> str:
    """The SQL without comments or blank lines: what a database executes."""
    lines = (line.split("--", 1)[0].rstrip() for line in sql_text.splitlines())
    return "\n".join(line for line in lines if line)


#: The schemas as they stand at version 2 (the last version before sagas).
POSTGRES_V2: Final = (FIXTURES / "postgres_schema_v2.sql").read_text(encoding="utf-8")
SQLITE_V2: Final = (FIXTURES / "sqlite_schema_v2.sql").read_text(encoding="utf-8")


#: The schemas as they stand at version 3 (the last version before approvals
#: for people): PostgreSQL's file, SQLite's scripts 1 to 3 in order, and
#: MySQL's first file (MySQL's tables start at version 3).
POSTGRES_V3: Final = (FIXTURES / "postgres_schema_v3.sql").read_text(encoding="utf-8")
SQLITE_V3: Final = (FIXTURES / "sqlite_schema_v3.sql").read_text(encoding="utf-8")
MYSQL_V3: Final = (FIXTURES / "mysql_schema_v3.sql").read_text(encoding="utf-8")
