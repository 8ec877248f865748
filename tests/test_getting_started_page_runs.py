"""docs/getting-started.md is one session: its commands, walked in order, print
what the page shows (issue 30).

The page's ```console blocks build on each other (the demo leaves a refund
that a later block approves), so they are replayed in one folder, in order,
instead of each in a fresh one as tests/test_docs.py does for other pages.
The fast test replays them with this virtualenv; the slow one starts where a
newcomer starts: a clean copy of the checkout, the page's own install
commands creating a fresh virtualenv, then every block, PostgreSQL included.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest

from tests.harness import DSN, require_postgres
from tests.test_docs import SAVED_AS, _docs_schema, _mask, _text, run_command

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "getting-started.md"
BLOCK = re.compile(r"^```(bash|console)\n(.*?)^```$", flags=re.M | re.S)
#: The server the page's PostgreSQL section names; the tests' own replaces it.
PAGE_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def blocks() -> list[tuple[str, str]]:
    """The page's shell blocks, in order: (``bash`` or ``console``, body)."""
    return BLOCK.findall(_text(PAGE))


def _clean_env(bin_dir: Path) -> dict[str, str]:
    drop = ("AGENT_LEDGER_URL", "NO_COLOR", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = str(bin_dir) + os.pathsep + env.get("PATH", "")
    return env


def _replay(session: str, folder: Path, env: dict[str, str]) -> None:
    steps = re.split(r"^\$ (.*)$", session, flags=re.M)[1:]
    commands, expected = steps[0::2], steps[1::2]
    assert commands, "a console block without `$ ` commands"
    for command, output in zip(commands, expected, strict=True):
        done = run_command(command, folder, env, timeout=120)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert _mask(done.stdout) == _mask(output.removeprefix("\n")), command


def walk(folder: Path, env: dict[str, str], *, run_bash: bool) -> int:
    """Save the page's files in ``folder``, then run its blocks in order; how many ran.

    A ```bash block runs as one script (so `. .venv/bin/activate` and
    `export` hold for the lines after them) and must succeed; once it has
    made ``.venv``, later blocks use that virtualenv's commands.
    """
    for name, code in SAVED_AS.findall(_text(PAGE)):
        (folder / name).write_text(code)
    ran = 0
    for kind, body in blocks():
        if kind == "console":
            _replay(body, folder, env)
        elif run_bash:
            script = body.replace(PAGE_DSN, DSN)
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script], cwd=folder, env=env,
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert done.returncode == 0, f"{body}\n{done.stdout}\n{done.stderr}"
            venv = folder / ".venv" / "bin"
            if venv.is_dir() and not env["PATH"].startswith(str(venv)):
                env["PATH"] = str(venv) + os.pathsep + env["PATH"]
                env["VIRTUAL_ENV"] = str(venv.parent)
        else:
            continue
        ran += 1
    return ran


def test_the_page_has_the_steps_a_newcomer_needs() -> None:
    """Install, the demo, the quick start, list/show/approve, a tool, PostgreSQL."""
    text = _text(PAGE)
    commands = "\n".join(body for _, body in blocks())
    for needed in (
        "pip install -e .",
        "$ python -m agent_ledger demo",
        "$ python quickstart.py",
        "$ agent-ledger list",
        "$ agent-ledger show",
        "$ agent-ledger approve",
        "@ledger.tool(",
        "agent-ledger init",
    ):
        assert needed in commands or needed in text, needed
    nav = (ROOT / "mkdocs.yml").read_text()
    first = re.search(r"^nav:\n\s+- (.+)$", nav, flags=re.M)
    assert first is not None and first.group(1) == "Getting started: getting-started.md"


def test_the_page_replays_in_one_folder(tmp_path: Path) -> None:
    """Every console block, in order, in one folder, with this virtualenv."""
    env = _clean_env(Path(sys.executable).parent)
    assert walk(tmp_path, env, run_bash=False) >= 4


@contextmanager
def _clean_copy(into: Path) -> Iterator[Path]:
    """The checkout as a clone would have it: tracked and new files, nothing ignored."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.split(b"\0")  # fmt: skip
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            target = into / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    yield into


@pytest.mark.slow
def test_a_newcomer_walks_the_page_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The page's own commands create the virtualenv and install; then every block runs.

    About a minute: two pip installs (the package, then its postgres extra).
    """
    require_postgres()
    # The interpreter the suite runs on provides `python3` for `python3 -m venv`.
    env = _clean_env(Path(sys.executable).parent)
    needs_schema = any(PAGE_DSN in body for _, body in blocks())
    with (
        _clean_copy(tmp_path / "clone") as clone,
        _docs_schema() if needs_schema else nullcontext(),
    ):
        ran = walk(clone, env, run_bash=True)
        assert (clone / ".venv" / "bin" / "agent-ledger").exists(), "the page made the venv"
    assert ran == len(blocks())
