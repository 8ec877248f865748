"""Counting the statements a client sends, from libpq's own trace of the protocol."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from psycopg import pq

#: A frontend message that runs a statement: simple Query, or extended-protocol Execute.
SENT_STATEMENT = re.compile(r"F\t\d+\t(Query|Execute)\t")


class Wire:
    """Attach to connections (pool ``configure=``), then count what they sent."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self.connections: list[Any] = []
        self.offset = 0

    async def attach(self, conn: Any) -> None:
        conn.pgconn.trace(self.fd)
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        self.connections.append(conn)

    def lines(self) -> list[str]:
        """Every trace line so far (flushed first)."""
        for conn in self.connections:  # libpq buffers its trace: untrace flushes it
            conn.pgconn.untrace()
            conn.pgconn.trace(self.fd)
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        return self.path.read_text().splitlines()

    def mark(self) -> None:
        self.offset = len(self.lines())

    def statements(self) -> list[str]:
        """The statements sent since the last mark (their trace lines); marks again."""
        lines = self.lines()
        sent = [line for line in lines[self.offset :] if SENT_STATEMENT.match(line)]
        self.offset = len(lines)
        return sent

    def count(self) -> int:
        return len(self.statements())

    def close(self) -> None:
        os.close(self.fd)
