"""A second heartbeat for SqliteStore holders, one that needs no write lock.

A heartbeat in the database is a write, and SQLite has one write lock for
the whole file: while another writer holds it (a long ``purge()``, a
``store.transaction()`` block, a stream of short transactions, a process
killed in the middle of one), a live holder cannot refresh its lease, and a
claim that wins the lock first would find it "silent" and take it over. So
liveness must not depend on winning that lock.

Each holding, ``(effect id, attempt)``, also has a file ``<id>.<attempt>``
in ``<database>-holders/``, whose modification time is a heartbeat written
with ``os.utime``: no database lock, no transaction. The takeover rule reads
both and goes by the later one: a holder is stale only when its stored
heartbeat *and* its file are older than the lease (the CLAIM and PARK
statements take the file's time as ``:seen_us``).

Who writes the file's time, and when:

* the step that makes a caller the holder (``begin`` inserting a
  ``processing`` effect, a ``claim`` that took one) notes the holding and
  its lease in memory, and writes nothing: its stored heartbeat is fresh,
  and most holdings end long before it ages;
* the holder's process keeps the file fresh from a thread of the store's
  (:class:`Holders`), without the write lock, for as long as the holder shows
  it is alive: each heartbeat, try or start it sends keeps the file fresh for
  :data:`GRACE_S` more (the engine sends one every third of the lease, and
  tries again at least every second while the store is blocked), and a
  ``commit`` or ``release`` keeps it fresh for as long as it is under way,
  however long it waits for the lock. The thread writes a holding's file
  once a period (a quarter of its lease, at most 250 ms) has passed since
  its last sign of life, so the file appears within a quarter of the lease
  of the holder being kept waiting, and a commit that lands at once (nearly
  all of them) never has one;
* the end of the holding (``commit`` or ``release`` returned) removes it; a
  takeover removes the previous holder's, and ``purge()`` removes any left
  by processes that died.

A missing file is evidence of death only in a folder that was there when
the holding began: the folder's ``.born`` marker (written by the first store
to open the database, and again by whoever finds it deleted) is read as a
sign of life for every holding in it, so a folder deleted by another process
protects its holdings for a lease, time for a live holder's thread to write
its file again. A folder that cannot be read protects them all.

What it relies on: every process that uses the file runs on the same machine
and reads the same clock (the file is stamped with the store's clock at the
sign of life, plus the real time since), and the filesystem keeps
modification times as set (not a network filesystem; SQLite itself needs a
local one). A process that is killed, frozen (SIGSTOP) or whose event loop
is blocked stops refreshing its file, and is taken over once the lease has
passed, as before; a process whose engine gave the effect up keeps it
looking alive for at most :data:`GRACE_S` more.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

from agent_ledger.observability import logger

__all__ = ["GRACE_S", "Holders"]

#: How long one sign of life from the holder (a heartbeat, a try, a start)
#: keeps its file fresh. Longer than the longest gap between two heartbeat
#: calls of a live engine while the store is blocked (a third of the lease,
#: or the one-second bound on a heartbeat call, whichever is longer) for
#: leases up to three seconds; longer leases need no continuity (their
#: file stays well within the lease between calls).
GRACE_S: Final = 2.0
#: The refresh thread writes each file at least this often...
_MAX_PERIOD_S: Final = 0.25
#: ...and a quarter of the shortest lease it keeps, but never more often than this.
_MIN_PERIOD_S: Final = 0.01

Holding = tuple[str, int]
#: The file whose time is the folder's birth (see ``Holders.born_us``).
_MARKER: Final = ".born"


class Holders:
    """The holder files of one SqliteStore, and the thread that keeps its own fresh.

    ``clock_us`` is the store's clock in µs since the epoch: the file's time
    is compared with it, as the stored heartbeat is.
    """

    def __init__(self, database: Path, clock_us: Callable[[], int]) -> None:
        # Every store on the file must find the same folder, however it named
        # the file: through a symlink, a relative path (and a later chdir), or
        # `..`. Hard links are the one spelling this cannot see (docs/sqlite.md).
        self.folder = Path(f"{os.path.realpath(database)}-holders")
        self._clock_us = clock_us
        self._lock = threading.Lock()
        #: Holdings of this store whose files its thread keeps fresh: until
        #: when (time.monotonic, for a sign of life), how many steps are
        #: under way (a commit or release), and the lease (ms, for the period).
        self._until: dict[Holding, float] = {}
        self._pending: dict[Holding, int] = {}
        self._leases: dict[Holding, int] = {}
        #: The store's clock (µs) and time.monotonic at the latest sign of
        #: life: the thread stamps the first plus the real time since the
        #: second. So a store clock moved by hand (a test's ManualClock) does
        #: not carry a holder that stopped into the future.
        self._base: dict[Holding, tuple[int, float]] = {}
        #: When the thread last wrote each file (time.monotonic).
        self._stamped: dict[Holding, float] = {}
        #: The holdings whose file the thread has written (removed at their end).
        self._written: set[Holding] = set()
        self._wake = threading.Event()
        #: Until when the thread sleeps (time.monotonic; inf: until woken).
        self._sleeps_until = float("inf")
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Set once the store has opened: a marker written later is a rebirth.
        self._opened = False
        self._warned = False

    def open(self) -> None:
        """The store opened the database: note the folder's birth if it has none yet."""
        self.born_us()
        self._opened = True

    # -- files (the store's own thread, under the write lock) --------------------

    def _path(self, holding: Holding) -> str:
        return os.path.join(self.folder, f"{holding[0]}.{holding[1]}")

    def hold(self, holding: Holding, lease_ms: int) -> None:
        """``holding`` is this store's (a begin or claim made it): its file may be kept."""
        with self._lock:
            self._leases[holding] = lease_ms

    def seen_us(self, holding: Holding) -> int:
        """The latest evidence that ``holding``'s holder is alive, in µs: its
        file's time, or the folder's birth if that is later (0: none).

        A missing file is evidence of death only in a folder that has been
        there all along: a folder deleted (and so born again) less than a
        lease ago may have taken a live holder's file with it, before the
        holder's thread could write it again. A folder that cannot be read
        is no evidence of death either (now: no takeover until it can be).
        """
        try:
            file_us = os.stat(self._path(holding)).st_mtime_ns // 1000
        except FileNotFoundError:
            file_us = 0
        except OSError:
            return self._clock_us()
        return max(file_us, self.born_us())

    def born_us(self) -> int:
        """When the folder was (last) created, by the store's clock, in µs.

        Kept as the time of its marker file ``.born``, written by whoever
        finds it missing: the first store to open the database (so a folder
        that was never deleted is older than every holding in it), or a
        claim that finds the folder, or just the marker, deleted.
        """
        marker = os.path.join(self.folder, _MARKER)
        try:
            return os.stat(marker).st_mtime_ns // 1000
        except FileNotFoundError:
            pass
        except OSError:
            return self._clock_us()
        now_us = self._clock_us()
        try:
            self.folder.mkdir(exist_ok=True)
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return self.born_us()  # another process's, just now
        except OSError:
            return now_us
        os.close(fd)
        with contextlib.suppress(OSError):
            os.utime(marker, ns=(now_us * 1000, now_us * 1000))
        if self._opened and not self._warned:
            self._warned = True  # once per store: a deleting loop would flood the log
            logger.warning(
                "the holders folder %s (or its marker) was missing: it was recreated, and "
                "no holder in it is taken over for a lease (deleting it while workers run "
                "hides their liveness)",
                self.folder,
            )
        return now_us

    def remove(self, holding: Holding, *, ours: bool = True) -> None:
        """The holding is over: its file goes (``ours``: only if this store wrote one)."""
        with self._lock:
            self._until.pop(holding, None)
            self._leases.pop(holding, None)
            self._base.pop(holding, None)
            written = holding in self._written
            self._written.discard(holding)
        if written or not ours:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(holding))

    def sweep(self, live: Callable[[Iterable[Holding]], set[Holding]]) -> None:
        """Remove every file whose holding is over; ``live`` says which of some are not."""
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return
        found: dict[Holding, str] = {}
        for name in names:
            effect_id, _, attempt = name.rpartition(".")
            if effect_id and attempt.isdigit():
                found[(effect_id, int(attempt))] = name
        keep = live(found)
        for holding, name in found.items():
            if holding not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.folder, name))

    # -- signs of life (the event loop) ------------------------------------------

    def alive(self, holdings: Iterable[Holding]) -> None:
        """The holder of each of ``holdings`` is alive: stamp its file now and
        keep it fresh for :data:`GRACE_S`. Only holdings this store made."""
        now = time.monotonic()
        now_us = self._clock_us()
        with self._lock:
            mine = [h for h in holdings if h in self._leases]
            for holding in mine:
                self._until[holding] = now + GRACE_S
                self._base[holding] = (now_us, now)
                self._stamped.setdefault(holding, now)
        if mine:
            self._ensure_thread(min(self._period(h) for h in mine))

    def under_way(self, holding: Holding) -> Callable[[], None]:
        """A commit or release of ``holding`` starts: keep its file fresh until
        the returned function is called (however long the step waits)."""
        with self._lock:
            if holding not in self._leases:
                return _nothing
            self._pending[holding] = self._pending.get(holding, 0) + 1
            now = time.monotonic()
            self._base[holding] = (self._clock_us(), now)
            self._stamped.setdefault(holding, now)
        self._ensure_thread(self._period(holding))

        def done() -> None:
            with self._lock:
                left = self._pending.get(holding, 1) - 1
                if left:
                    self._pending[holding] = left
                else:
                    self._pending.pop(holding, None)
                # A failed step may be tried again: a last grace for that.
                if holding in self._leases:
                    self._until[holding] = time.monotonic() + GRACE_S

        return done

    def _write(self, holding: Holding, at_us: int) -> None:
        """Stamp ``holding``'s file ``at_us``, creating it (and the folder) if need be."""
        path = self._path(holding)
        at_ns = at_us * 1000
        try:
            os.utime(path, ns=(at_ns, at_ns))
        except FileNotFoundError:
            with self._lock:
                if holding not in self._leases:
                    return  # over meanwhile: never bring its file back
                self._written.add(holding)
            self.folder.mkdir(exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
            os.utime(path, ns=(at_ns, at_ns))

    # -- the refresh thread ------------------------------------------------------

    def _ensure_thread(self, period: float) -> None:
        """Start the thread, or wake it if it would first look later than ``period``
        from now (a commit that lands at once then costs no thread switch)."""
        if self._thread is not None or self._closed:
            if time.monotonic() + period < self._sleeps_until:
                self._wake.set()
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._refresh, name="agent-ledger-sqlite-holders", daemon=True
                )
                self._thread.start()

    def _refresh(self) -> None:
        while not self._closed:
            now = time.monotonic()
            with self._lock:
                for holding, until in list(self._until.items()):
                    if until <= now and holding not in self._pending:
                        del self._until[holding]
                kept = set(self._until) | set(self._pending)
                for holding in set(self._stamped) - kept:
                    del self._stamped[holding]
                due = {
                    h: (anchor, self._period(h))
                    for h in kept
                    if (anchor := self._base.get(h)) is not None
                }
            if not due:
                self._sleeps_until = float("inf")
                self._wake.wait()
                self._wake.clear()
                continue
            wait = _MAX_PERIOD_S
            for holding, ((base_us, base), period) in due.items():
                left = self._stamped.get(holding, now) + period - now
                if left <= 0:
                    try:
                        self._write(holding, base_us + int((now - base) * 1_000_000))
                    except OSError:
                        logger.warning("could not write a holder file in %s", self.folder)
                    self._stamped[holding] = now
                    left = period
                wait = min(wait, left)
            wait = max(wait, _MIN_PERIOD_S)
            self._sleeps_until = time.monotonic() + wait
            self._wake.wait(wait)
            self._wake.clear()

    def _period(self, holding: Holding) -> float:
        lease_ms = self._leases.get(holding, 0)
        if lease_ms <= 0:
            return _MAX_PERIOD_S
        return min(max(lease_ms / 4000, _MIN_PERIOD_S), _MAX_PERIOD_S)

    def close(self) -> None:
        """Stop the thread (the files stay: their holdings may still be open)."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)


def _nothing() -> None:
    pass
