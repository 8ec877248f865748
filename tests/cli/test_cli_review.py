"""`agent-ledger review` at a real terminal: a pseudo-terminal, real keystrokes.

The console script runs in a subprocess whose stdin, stdout and stderr are
the secondary side of a pty (so ``isatty()`` is true, as at a person's
terminal); the test types on the primary side and reads what the reviewer
would see. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent_ledger import ApprovalPendingError, EffectStatus, RunOptions, ToolCall
from agent_ledger.calls import ResourceDescriptor
from agent_ledger.stores.url import open_store
from agent_ledger.testing import build_ledger
from tests.cli.conftest import SCRIPT, Cli
from tests.test_docs import ROOT, _mask

PROMPT = "[a]pprove, [d]eny, [s]kip, [q]uit? "


class Terminal:
    """The primary side of a pty the command runs on."""

    def __init__(self, fd: int, process: subprocess.Popen[bytes]) -> None:
        self.fd = fd
        self.process = process
        self.seen = ""
        #: Everything the command has shown so far.
        self.transcript = ""

    def expect(self, text: str, timeout: float = 30.0) -> str:
        """Read until ``text`` has appeared (after what earlier expects consumed)."""
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"never saw {text!r}; the screen shows:\n{self.seen}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # the command ended and closed its side
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"the command ended before {text!r}:\n{self.seen}")
                got = chunk.decode(errors="replace").replace("\r\n", "\n")
                self.seen += got
                self.transcript += got
        shown, _, self.seen = self.seen.partition(text)
        return shown + text

    def type(self, line: str) -> None:
        os.write(self.fd, line.encode() + b"\r")

    def finish(self, timeout: float = 30.0) -> str:
        """The rest of the output, once the command has exited 0."""
        rest = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                got = chunk.decode(errors="replace").replace("\r\n", "\n")
                rest += got
                self.transcript += got
            elif self.process.poll() is not None:
                break
        assert self.process.wait(timeout=timeout) == 0, self.seen + rest
        return self.seen + rest


def _own_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@contextmanager
def terminal(cli: Cli, *args: str, command: Sequence[str] = (SCRIPT,)) -> Iterator[Terminal]:
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_LEDGER_URL", "NO_COLOR")}
    env["USER"] = env["LOGNAME"] = "reviewer-os"
    process = subprocess.Popen(
        [*command, "--url", cli.url, "review", *args],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        cwd=cli.cwd,
        env=env,
        # Its own session, with the pty as its controlling terminal, as a login
        # shell has: Ctrl-C typed there becomes SIGINT for the command.
        preexec_fn=_own_terminal,
    )
    os.close(secondary)
    try:
        yield Terminal(primary, process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        os.close(primary)


CALLS = [
    ToolCall(workflow_id="ops", tool="db.drop", args={"table": "users", "why": "\x1b[2Jcleanup"}),
    ToolCall(workflow_id="ops", tool="k8s.scale", args={"replicas": 0, "svc": "api"}),
    ToolCall(workflow_id="ops", tool="mail.blast", args={"to": "everyone"}, call_id="c-3"),
]


async def make_pending(url: str) -> list[str]:
    """The three calls waiting for approval, created in order; their keys."""
    store = await open_store(url)
    try:
        ledger = build_ledger(store)
        asking = RunOptions(requires_approval=True, wait_for_approval=False)
        for call in CALLS:
            with pytest.raises(ApprovalPendingError):
                await ledger.run(call, lambda e: "ran", asking)
            await asyncio.sleep(0.01)  # distinct creation times: a strict order
        return [ledger.idem_key(call) for call in CALLS]
    finally:
        await store.close()


async def stored(url: str, key: str) -> tuple[EffectStatus, str | None, str | None, str | None]:
    store = await open_store(url)
    try:
        effect = await store.find(key)
        assert effect is not None
        reason = effect.error.message if effect.error is not None else None
        return effect.status, effect.decided_by, effect.decision_note, reason
    finally:
        await store.close()


def test_a_review_session(cli: Cli) -> None:
    """Oldest first, each receipt whole; approve with a note, deny with a reason, skip."""
    assert cli("init").returncode == 0
    keys = asyncio.run(make_pending(cli.url))
    with terminal(cli) as term:
        first = term.expect(PROMPT)
        assert "3 effects waiting for approval, oldest first; deciding as reviewer-os" in first
        assert "[1/3]" in first and "db.drop" in first and keys[0] in first
        assert '"table": "users"' in first  # args pretty-printed, one key a line
        # JSON escapes the control character: the screen is never cleared.
        assert "\\u001b[2Jcleanup" in first and "\x1b[2J" not in first
        assert "waiting" in first and "created" in first
        term.type("x")
        term.expect("not an answer: 'x'")
        term.expect(PROMPT)
        term.type("a")
        term.expect("note (optional, Enter for none): ")
        term.type("checked the backup")
        second = term.expect(PROMPT)
        assert "approved db.drop" in second and "[2/3]" in second and "k8s.scale" in second
        term.type("d")
        term.expect("reason (required; the caller sees it): ")
        term.type("")  # a denial needs its reason
        term.expect("reason (required; the caller sees it): ")
        term.type("not during business hours")
        third = term.expect(PROMPT)
        assert "denied k8s.scale" in third and "mail.blast" in third and "c-3" in third
        term.type("s")
        rest = term.finish()
    assert "skipped: it still waits" in rest
    assert "review done: 1 approved, 1 denied, 1 skipped" in rest
    assert "Traceback" not in rest
    assert asyncio.run(stored(cli.url, keys[0])) == (
        EffectStatus.READY,
        "reviewer-os",
        "checked the backup",
        None,
    )
    assert asyncio.run(stored(cli.url, keys[1])) == (
        EffectStatus.DENIED,
        "reviewer-os",
        None,
        "not during business hours",
    )
    assert asyncio.run(stored(cli.url, keys[2]))[0] is EffectStatus.REQUIRES_APPROVAL


def test_quit_and_end_of_input_stop_the_walk(cli: Cli) -> None:
    assert cli("init").returncode == 0
    keys = asyncio.run(make_pending(cli.url))
    with terminal(cli, "--by", "carol") as term:
        assert "deciding as carol" in term.expect(PROMPT)
        term.type("q")
        rest = term.finish()
    # Quitting at 1 of 3 leaves all three: the one on screen was not reviewed either.
    assert "stopped; 3 effects not reviewed" in rest
    with terminal(cli) as term:
        term.expect(PROMPT)
        os.write(term.fd, b"\x04")  # Ctrl-D: end of input
        rest = term.finish()
    assert "stopped; 3 effects not reviewed" in rest and "Traceback" not in rest
    for key in keys:
        assert asyncio.run(stored(cli.url, key))[0] is EffectStatus.REQUIRES_APPROVAL
    # Skip two, quit at the last: one left, the one on screen.
    with terminal(cli) as term:
        for _ in range(2):
            term.expect(PROMPT)
            term.type("s")
        assert "[3/3]" in term.expect(PROMPT)
        term.type("q")
        rest = term.finish()
    assert "stopped; 1 effect not reviewed" in rest


def test_ctrl_c_at_a_prompt_stops_at_once(cli: Cli) -> None:
    """The prompt's reader is a daemon thread: Ctrl-C ends the command (exit 130) without
    waiting for another Enter, and records nothing."""
    assert cli("init").returncode == 0
    keys = asyncio.run(make_pending(cli.url))
    with terminal(cli) as term:
        term.expect(PROMPT)
        os.write(term.fd, b"\x03")
        assert term.process.wait(timeout=10) == 130
    assert asyncio.run(stored(cli.url, keys[0]))[0] is EffectStatus.REQUIRES_APPROVAL


#: The command, with SIGINT sent to the prompt's reader thread instead of the main thread.
_INTERRUPT_THE_READER = """
import signal, sys, threading, time
from agent_ledger.cli import main

def interrupt_the_reader():
    while True:
        for thread in threading.enumerate():
            if thread.name == "agent-ledger-review-input" and thread.ident is not None:
                signal.pthread_kill(thread.ident, signal.SIGINT)
                return
        time.sleep(0.01)

threading.Thread(target=interrupt_the_reader, daemon=True).start()
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_given_to_another_thread_stops_at_once(cli: Cli) -> None:
    """The kernel may hand Ctrl-C's SIGINT to any thread of the process (here: the prompt's
    reader, blocked in input()); the command still stops at once with 130, records nothing."""
    assert cli("init").returncode == 0
    keys = asyncio.run(make_pending(cli.url))
    with terminal(cli, command=(sys.executable, "-c", _INTERRUPT_THE_READER)) as term:
        assert term.process.wait(timeout=10) == 130
    assert asyncio.run(stored(cli.url, keys[0]))[0] is EffectStatus.REQUIRES_APPROVAL


def test_two_reviewers_at_once(cli: Cli) -> None:
    """Both see the same oldest effect; the second to decide is told it was decided
    already (by whom, and how), nothing of theirs is recorded, and the walk goes on."""
    assert cli("init").returncode == 0
    keys = asyncio.run(make_pending(cli.url))
    with terminal(cli, "--by", "alice") as alice, terminal(cli, "--by", "bob") as bob:
        assert "db.drop" in alice.expect(PROMPT)
        assert "db.drop" in bob.expect(PROMPT)
        alice.type("a")
        alice.expect("note (optional, Enter for none): ")
        alice.type("")
        assert "approved db.drop" in alice.expect(PROMPT)
        bob.type("d")
        bob.expect("reason (required; the caller sees it): ")
        bob.type("no")
        told = bob.expect(PROMPT)
        assert "db.drop (" in told and "was already decided by alice: it is now ready" in told
        # Alice now skips the second; Bob, still on it, denies it.
        alice.type("s")
        bob.type("d")
        bob.expect("reason (required; the caller sees it): ")
        bob.type("too risky")
        assert "denied k8s.scale" in bob.expect(PROMPT)
        # Alice's third is the one Bob has not decided; Bob quits.
        bob.type("q")
        alice_third = alice.expect(PROMPT)
        assert "mail.blast" in alice_third
        alice.type("q")
        assert "Traceback" not in alice.finish() + bob.finish()
    assert asyncio.run(stored(cli.url, keys[0]))[:2] == (EffectStatus.READY, "alice")
    assert asyncio.run(stored(cli.url, keys[1]))[:2] == (EffectStatus.DENIED, "bob")


def test_an_effect_decided_before_it_is_shown_is_not_asked_about(cli: Cli) -> None:
    assert cli("init").returncode == 0
    keys = asyncio.run(make_pending(cli.url))
    with terminal(cli, "--by", "alice") as term:
        term.expect(PROMPT)
        assert cli("deny", keys[1][:12], "--reason", "dup", "--by", "bob").returncode == 0
        term.type("s")
        shown = term.expect(PROMPT)
        assert "k8s.scale" in shown and "was already decided by bob: it is now denied" in shown
        assert "[3/3]" in shown and "mail.blast" in shown
        term.type("q")
        term.finish()


#: What must never reach the reviewer's terminal raw (CR and LF are the pty's own).
RAW_CONTROL = re.compile("[\x00-\x09\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
NASTY = [
    ToolCall(
        workflow_id="ops\x1b]0;owned\x07",
        tool="evil\x1b[2J\u009b31mtool",
        args={"c1": "A\u009b2JB", "del": "x\x7fy", "bidi": "pay \u202etxt.exe"},
        resource=ResourceDescriptor(namespace="acct\u009b1m", type="t", id={"r": "r\x1b[5m"}),
        call_id="c\u0085all",
    ),
    ToolCall(workflow_id="ops", tool="second\u009b2Ktool\n", args={}),
]


async def make_nasty(url: str) -> list[str]:
    store = await open_store(url)
    try:
        ledger = build_ledger(store)
        asking = RunOptions(requires_approval=True, wait_for_approval=False)
        for call in NASTY:
            with pytest.raises(ApprovalPendingError):
                await ledger.run(call, lambda e: "ran", asking)
            await asyncio.sleep(0.01)
        return [ledger.idem_key(call) for call in NASTY]
    finally:
        await store.close()


def test_agent_and_person_text_never_reaches_the_terminal_raw(cli: Cli) -> None:
    """Tool, workflow, call id, args, resource, the reviewer's and another decider's
    names: every one is shown with its ESC, C1, DEL and bidirectional characters
    escaped, in the receipt, the approve line and the already-decided line."""
    assert cli("init").returncode == 0
    keys = asyncio.run(make_nasty(cli.url))
    with terminal(cli, "--by", "eve\x1b[1m\u009b") as term:
        first = term.expect(PROMPT)
        assert "deciding as eve\\x1b[1m\\x9b" in first
        assert "evil\\x1b[2J\\x9b31mtool" in first and "ops\\x1b]0;owned\\x07" in first
        assert "c\\x85all" in first and "acct\\x9b1m" in first and "r\\u001b[5m" in first
        assert "A\\x9b2JB" in first and "x\\x7fy" in first and "pay \\u202etxt.exe" in first
        term.type("a")
        term.expect("note (optional, Enter for none): ")
        term.type("")
        second = term.expect(PROMPT)
        assert "approved evil\\x1b[2J\\x9b31mtool (" in second
        assert "second\\x9b2Ktool\\x0a" in second
        decided = cli("deny", keys[1][:12], "--reason", "no", "--by", "mal\x1b[8mlory")
        assert decided.returncode == 0
        term.type("d")
        term.expect("reason (required; the caller sees it): ")
        term.type("dup")
        rest = term.finish()
    assert "second\\x9b2Ktool\\x0a (" in rest
    assert "was already decided by mal\\x1b[8mlory: it is now denied" in rest
    assert RAW_CONTROL.findall(term.transcript) == []


def test_review_refuses_without_a_terminal(cli: Cli) -> None:
    assert cli("init").returncode == 0
    done = cli("review", input_text="a\n")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "stdin is not one" in done.stderr
    assert "Traceback" not in done.stderr


def test_nothing_to_review(cli: Cli) -> None:
    assert cli("init").returncode == 0
    with terminal(cli) as term:
        assert "nothing waits for approval" in term.finish()


def test_the_session_on_the_cli_page_is_real(tmp_path: Path) -> None:
    """docs/cli.md shows a review session; replaying it prints the same, up to times,
    durations and ids (the masks the docs tests use)."""
    page = (ROOT / "docs" / "cli.md").read_text()
    shown = page.split("<!-- review-session -->\n```text\n", 1)[1].split("\n```", 1)[0]
    command, _, expected = shown.partition("\n")
    assert command == "$ agent-ledger review --by ada"
    cli = Cli(f"sqlite:///{tmp_path / 'agent_ledger.db'}", tmp_path)
    assert cli("demo", "payment").returncode == 0  # leaves the refund waiting for a person
    with terminal(cli, "--by", "ada") as term:
        term.expect(PROMPT)
        term.type("a")
        term.expect("note (optional, Enter for none): ")
        term.type("customer called")
        term.finish()
    screen = term.transcript
    assert _mask(screen).rstrip("\n") == _mask(expected), screen
