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

    def _lines(self) -> list[str]:
        for conn in self.connections:  # libpq buffers its trace: untrace flushes it
            conn.pgconn.untrace()
            conn.pgconn.trace(self.fd)
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        return self.path.read_text().splitlines()

    def mark(self) -> None:
        self.offset = len(self._lines())

    def count(self) -> int:
        lines = self._lines()
        sent = sum(1 for line in lines[self.offset :] if SENT_STATEMENT.match(line))
        self.offset = len(lines)
        return sent

    def close(self) -> None:
        os.close(self.fd)
