"""A TCP forwarder that fault tests put between a client and its server, to cut the link.

``drop(seconds)`` resets every open link at once, both ends (the client sees
its connection reset, the server sees its client vanish and ends the
backend), then for ``seconds`` resets each new connection as soon as it is
accepted: to the client the server has gone away and will not talk. After
that the proxy forwards again as if nothing happened.

It runs on the caller's event loop, listens on 127.0.0.1 on a port the OS
chooses (``port``), and only ever touches the connections that go through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

__all__ = ["TcpProxy"]

_CHUNK = 64 * 1024


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a polite FIN: the link just dies."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One client connection and its upstream twin."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server

    def cut(self) -> None:
        _reset(self.client)
        _reset(self.server)


class TcpProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_host:upstream_port``; can drop the link."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.port = 0
        #: Connections forwarded, reset by a drop, and refused during one.
        self.accepted = 0
        self.cut = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._down_until = 0.0

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for link in list(self._links):
            link.cut()
        # A cut link ends its pumps, and with them the connection's task. (Not
        # cancelled: asyncio's stream server reports a cancelled handler as an error.)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    # -- faults -----------------------------------------------------------------

    @property
    def down(self) -> bool:
        return asyncio.get_running_loop().time() < self._down_until

    def drop(self, seconds: float) -> None:
        """Reset every open link now, and refuse new ones for ``seconds``."""
        loop = asyncio.get_running_loop()
        self._down_until = max(self._down_until, loop.time() + seconds)
        links, self._links = self._links, set()
        for link in links:
            link.cut()
        self.cut += len(links)

    async def wait_up(self) -> None:
        """Sleep until the current outage (if any) is over."""
        loop = asyncio.get_running_loop()
        while (left := self._down_until - loop.time()) > 0:
            await asyncio.sleep(left)

    # -- forwarding ---------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            self.refused += 1
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            _reset(writer)
            return
        if self.down:  # the link dropped while we were connecting upstream
            self.refused += 1
            _reset(writer)
            _reset(up_writer)
            return
        self.accepted += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            pumps = [
                asyncio.create_task(_pump(reader, up_writer)),
                asyncio.create_task(_pump(up_reader, writer)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        finally:
            self._tasks.discard(task)
            # One side closed (or the link was cut): close the other side too.
            self._links.discard(link)
            link.cut()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
