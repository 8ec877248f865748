"""The README and every docs page say what the code does: their examples run as written.

* Every ```python block runs in a fresh process, twice in the same folder,
  because a reader who copies an example runs it again (forked from an
  interpreter that has imported only agent_ledger, when that is the
  snippet's first import: see ``_run_python``).
* Every ```console block is replayed in a fresh folder and must print what the
  page shows, up to times, durations and ids (its Python commands forked
  like the snippets: see ``run_command``).
* The PostgreSQL page's shell set-up, example and audit SQL work together on
  one schema; the MariaDB/MySQL page's on one database.

Fences the tests do not run: ```bash (install and test commands), ```text
(signatures, diagrams) and ```sql (run only by the PostgreSQL and MySQL pages' tests).
Any other language fails ``test_every_fence_is_a_known_language``, so a typo
cannot quietly turn a snippet off.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent_ledger.status import REOPENABLE, TERMINAL, TRANSITIONS, EffectStatus
from tests import forkserver
from tests.harness import DSN, MYSQL_URL, require_mysql, require_postgres

if TYPE_CHECKING:
    from psycopg import Connection

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: pymdownx.snippets includes (``--8<-- "path"``), resolved from the repository root
#: as mkdocs.yml configures them, so the tests see what a reader sees.
INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', flags=re.M)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.M | re.S)
KNOWN_FENCES = {"python", "console", "bash", "text", "sql"}
#: The schema the PostgreSQL page's examples use; the tests drop it afterwards.
DOCS_SCHEMA = "agent_ledger"
#: The database the MySQL page's examples get (as $MYSQL_URL): this session's own,
#: so that checkouts sharing a server never collide; dropped afterwards.
DOCS_DATABASE = f"agent_ledger_docs_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def _text(page: Path) -> str:
    return INCLUDE.sub(lambda m: (ROOT / m.group(1)).read_text(), page.read_text())


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _blocks(page: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(_text(page)) if lang == language]


SNIPPETS = [(page, i, code) for page in PAGES for i, code in enumerate(_blocks(page, "python"))]
#: Pages whose console blocks are one session, replayed in order in one folder
#: by their own test (tests/test_getting_started_page_runs.py), not each alone.
WALKED = {ROOT / "docs" / "getting-started.md"}
SESSIONS = [
    (page, i, body)
    for page in PAGES
    if page not in WALKED
    for i, body in enumerate(_blocks(page, "console"))
]


def _id(item: tuple[Path, int, str]) -> str:
    return f"{_name(item[0])}:{item[1]}"


def test_pages_have_snippets_and_sessions() -> None:
    """The extraction works, so the parametrized tests below are not vacuous."""
    assert len(PAGES) >= 10
    assert len(SNIPPETS) >= 10
    assert len(SESSIONS) >= 2
    assert _blocks(ROOT / "README.md", "python"), "the README has a quick start"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_fence_is_a_known_language(page: Path) -> None:
    """A block is run, replayed, or deliberately shown only; none is skipped by a typo."""
    unknown = {lang for lang, _ in FENCE.findall(_text(page))} - KNOWN_FENCES
    assert not unknown, f"{_name(page)}: fences {unknown}; use one of {sorted(KNOWN_FENCES)}"


# -- python snippets ------------------------------------------------------------


def _first_agent_ledger_import(code: str) -> str | None:
    """The agent_ledger module the script imports before any statement but an
    import (None if it does anything else first): a process that has imported
    it already has done nothing the script would not have done itself."""
    for statement in ast.parse(code).body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring
        if isinstance(statement, ast.Import):
            names = [alias.name for alias in statement.names]
        elif isinstance(statement, ast.ImportFrom):
            names = [statement.module or ""]
        else:
            return None
        for name in names:
            if name.split(".")[0] == "agent_ledger":
                return name
    return None


def _run_python(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT`` in ``cwd``. A snippet that imports agent_ledger before it
    does anything runs in a process forked from an interpreter that has only
    imported that (tests/forkserver.py): what a fresh interpreter would have
    done first anyway, for a tenth of the CPU."""
    env = {**os.environ, "DATABASE_URL": DSN, "MYSQL_URL": _docs_mysql_url()}
    first = _first_agent_ledger_import(script.read_text())
    if first is not None:
        return forkserver.run([script], cwd=cwd, env=env, timeout=60, preload=[first])
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )


def _docs_mysql_url() -> str:
    from urllib.parse import urlsplit, urlunsplit

    return urlunsplit(urlsplit(MYSQL_URL)._replace(path="/" + DOCS_DATABASE))


async def _mysql_statement(statement: str) -> list[Any]:
    """One statement on the test server, in $MYSQL_URL's own database."""
    from agent_ledger.stores.mysql import MySQLStore

    store = await MySQLStore.connect(MYSQL_URL, max_size=1)
    try:
        async with store._pool.connection() as conn, conn.cursor() as cur:
            await cur.execute(statement)
            return list(await cur.fetchall())
    finally:
        await store.close()


@contextmanager
def _docs_database() -> Iterator[None]:
    """The docs' MySQL database (this session's own name), empty; dropped afterwards."""
    from tests.harness import _in_a_thread

    _in_a_thread(lambda: _mysql_statement(f"DROP DATABASE IF EXISTS `{DOCS_DATABASE}`"))
    _in_a_thread(lambda: _mysql_statement(f"CREATE DATABASE `{DOCS_DATABASE}`"))
    try:
        yield
    finally:
        _in_a_thread(lambda: _mysql_statement(f"DROP DATABASE IF EXISTS `{DOCS_DATABASE}`"))


def _drop_docs_schema(conn: Connection[Any]) -> None:
    from psycopg import sql

    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(DOCS_SCHEMA)))


@contextmanager
def _docs_schema() -> Iterator[Connection[Any]]:
    """The docs' schema, empty, for this test alone; dropped afterwards.

    Several checkouts may run the suite against one server at once, and the
    schema name is fixed by the pages, so an advisory lock serializes them.
    """
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext('agent_ledger docs tests'))")
        _drop_docs_schema(conn)
        try:
            yield conn
        finally:
            _drop_docs_schema(conn)


#: The CrewAI page's examples need CrewAI, which lives in a virtualenv of its own
#: (.ci/run runs them there with `pytest -m crewai`); elsewhere they are skipped.
CREWAI_PAGE = ROOT / "docs" / "adapters" / "crewai.md"
_CREWAI_MISSING = (
    importlib.util.find_spec("crewai") is None
    and os.environ.get("AGENT_LEDGER_REQUIRE_CREWAI") != "1"
)


def _snippet_param(item: tuple[Path, int, str]) -> Any:
    """A snippet as a test parameter. The framework adapters' pages import their SDKs
    in every snippet (4 to 20 CPU-seconds each, twice): the slow tier runs them
    (tests/adapters/ covers the adapters themselves in plain pytest). The CrewAI
    page's are marked ``crewai`` instead (see ``CREWAI_PAGE``)."""
    page, _, _ = item
    if page == CREWAI_PAGE:
        marks = [
            pytest.mark.crewai,
            pytest.mark.skipif(_CREWAI_MISSING, reason="CrewAI has its own virtualenv (.ci/run)"),
        ]
        return pytest.param(*item, id=_id(item), marks=marks)
    slow = page.parent.name == "adapters"
    return pytest.param(*item, id=_id(item), marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize(("page", "index", "snippet"), [_snippet_param(s) for s in SNIPPETS])
def test_snippet_runs_twice(page: Path, index: int, snippet: str, tmp_path: Path) -> None:
    """Each ```python block runs without error, and again in the same folder."""
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    where = f"{_name(page)}, python block {index}"
    needs_postgres = "PostgresStore" in snippet
    needs_mysql = "MySQLStore" in snippet
    if needs_postgres:
        require_postgres()
        assert f'schema="{DOCS_SCHEMA}"' in snippet, f"{where}: use schema={DOCS_SCHEMA!r}"
    if needs_mysql:
        require_mysql()
        assert 'os.environ.get("MYSQL_URL"' in snippet, f"{where}: read the URL from $MYSQL_URL"
    with (
        _docs_schema() if needs_postgres else contextlib.nullcontext(),
        _docs_database() if needs_mysql else contextlib.nullcontext(),
    ):
        for run in ("first", "second"):
            done = _run_python(script, tmp_path)
            assert done.returncode == 0, f"{where}, {run} run:\n{snippet}\n{done.stderr}"


# -- console sessions ----------------------------------------------------------

#: Parts of the output that differ on every run: times, durations, effect ids.
VOLATILE = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00"), "<time>"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"), "<time>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\d+\.\d m?s\b"), "<duration>"),
    # A saga's owner: host name and process id.
    (re.compile(r"(?<=owner )\S+:\d+"), "<owner>"),
]
#: "Save this as `name`:" right before a python block puts that file in the session's folder.
SAVED_AS = re.compile(r"Save this as `([^`]+)`:\n\n```python\n(.*?)^```$", flags=re.M | re.S)


def _mask(text: str) -> str:
    for pattern, placeholder in VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


#: What only a shell can run: pipes, redirections, lists, expansions, globs.
_SHELL_SYNTAX = re.compile(r"[|&;<>()$`\\*?\[\]{}~!#]")


def _python_program(command: str, cwd: Path, env: dict[str, str]) -> list[str] | None:
    """``[python, script, *args]`` when ``command`` is ``python SCRIPT ARGS`` or a
    Python console script on PATH with its arguments, and needs no shell."""
    if _SHELL_SYNTAX.search(command):
        return None
    try:
        words = shlex.split(command)
    except ValueError:  # an unbalanced quote: the shell says what is wrong
        return None
    if not words:
        return None
    found = shutil.which(words[0], path=env.get("PATH"))
    if found is None:
        return None
    if words[0] == "python":
        if len(words) < 2 or words[1].startswith("-"):
            return None  # python -m ..., python -c ...
        return [found, *words[1:]]
    with open(found, "rb") as program:
        first_line = program.readline()
    if not first_line.startswith(b"#!"):
        return None
    interpreter = first_line[2:].decode(errors="replace").strip()
    if "python" not in interpreter or " " in interpreter:
        return None  # not Python, or through env: let the shell run it
    return [interpreter, found, *words[1:]]


def run_command(
    command: str, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``bash -c COMMAND`` in ``cwd``. A Python program (``python SCRIPT``, or a
    console script such as ``agent-ledger``) whose script imports agent_ledger
    before it does anything runs without the shell, in a process forked from an
    interpreter that has imported that module (see ``_run_python``)."""
    program = _python_program(command, cwd, env)
    if program is not None:
        python, script, *args = program
        source = Path(cwd, script)
        first = _first_agent_ledger_import(source.read_text()) if source.is_file() else None
        if first is not None:
            return forkserver.run(
                [script, *args], cwd=cwd, env=env, timeout=timeout, python=python, preload=[first]
            )
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(("page", "index", "session"), SESSIONS, ids=[_id(s) for s in SESSIONS])
def test_console_session_is_real_output(
    page: Path, index: int, session: str, tmp_path: Path
) -> None:
    """Replaying a ```console block in a fresh folder prints what the page shows."""
    for name, code in SAVED_AS.findall(_text(page)):
        (tmp_path / name).write_text(code)
    steps = re.split(r"^\$ (.*)$", session, flags=re.M)[1:]
    commands, expected = steps[0::2], steps[1::2]
    assert commands, f"{_name(page)}: console block {index} has no `$ ` commands"
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENT_LEDGER_URL", "NO_COLOR")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    for command, output in zip(commands, expected, strict=True):
        done = run_command(command, tmp_path, env, timeout=60)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert _mask(done.stdout) == _mask(output.removeprefix("\n")), command


# -- what the pages claim ---------------------------------------------------------


def test_ci_runs_the_readme_commands_for_a_fresh_clone() -> None:
    """.ci/run's second fresh virtualenv runs exactly the README's install and test
    commands, which the README still gives as commands of their own."""
    ci = (ROOT / ".ci" / "run").read_text()
    said = {}
    for name in ("README_INSTALL", "README_TEST"):
        found = re.search(rf"^{name}='([^']*)'$", ci, flags=re.M)
        assert found is not None, name
        said[name] = found.group(1)
        assert f'eval "${name}"' in ci, f".ci/run defines {name} but does not run it"
    commands = [
        line.split(" #")[0].strip()
        for block in _blocks(ROOT / "README.md", "bash")
        for line in block.splitlines()
    ]
    assert said == {"README_INSTALL": 'pip install -e ".[dev]"', "README_TEST": "pytest"}
    assert set(said.values()) <= set(commands)


def test_readme_is_a_landing_page() -> None:
    """The README stays short: the manual belongs in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_install_lines_install_this_project(page: Path) -> None:
    """No install line names agent-ledger on the package index: that is another project."""
    for line in _blocks(page, "bash"):
        for command in line.splitlines():
            assert not re.search(r"pip install\b.*\bagent[-_]ledger\b", command), command


def test_state_machine_diagram_matches_the_transition_table() -> None:
    """The diagram in concepts.md lists exactly the transitions of status.TRANSITIONS."""
    diagram = next(b for b in _blocks(ROOT / "docs" / "concepts.md", "text") if "->" in b)
    documented: dict[EffectStatus, frozenset[EffectStatus]] = {}
    for line in diagram.strip().splitlines():
        source, targets = line.split("->")
        names = (re.sub(r"\(.*?\)", "", t).strip() for t in targets.split("|"))
        documented[EffectStatus(source.strip())] = frozenset(EffectStatus(n) for n in names)
    # Every status with a way out; a terminal one's only way is a person's reopen.
    expected = {s: out for s, out in TRANSITIONS.items() if out}
    assert documented == expected
    assert {s for s in documented if s in TERMINAL} == REOPENABLE


def test_postgres_page_sets_up_audits_and_cleans_one_schema(tmp_path: Path) -> None:
    """Each way the page sets up the schema (agent-ledger init, psql) puts the tables
    in the docs' schema; then its example and its audit SQL use that schema."""
    require_postgres()
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    page = ROOT / "docs" / "postgres.md"
    setups = [
        b
        for b in _blocks(page, "bash")
        if ("agent-ledger init" in b or "psql " in b)
        and "--partitioned" not in b
        and "--roles" not in b
        and "GRANT " not in b
    ]  # the partitioned init and the roles have their own tests (tests/postgres/)
    assert [("agent-ledger init" in b) for b in setups] == [True, False], "init first, then psql"
    # The first example and the first SQL block; later sections have their own tests.
    example = _blocks(page, "python")[0]
    audit = _blocks(page, "sql")[0]
    from psycopg import sql

    from agent_ledger.stores.postgres import SCHEMA_VERSION

    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k != "AGENT_LEDGER_URL"}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["DATABASE_URL"] = DSN
    versions = sql.SQL("SELECT max(version) FROM {}").format(
        sql.Identifier(DOCS_SCHEMA, "agent_ledger_schema_version")
    )
    for setup in setups:
        # The page's own server URL stands for the suite's.
        script = re.sub(r'DATABASE_URL="[^"]*"', f'DATABASE_URL="{DSN}"', setup)
        with _docs_schema() as conn:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", script],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, f"{setup}: {done.stderr}"
            assert conn.execute(versions).fetchone() == (SCHEMA_VERSION,), setup
    with _docs_schema() as conn:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        example_file = tmp_path / "example.py"
        example_file.write_text(example)
        done = _run_python(example_file, tmp_path)
        assert done.returncode == 0, done.stderr

        statements = [s for s in audit.split(";") if s.strip()]
        assert len(statements) == 3
        rows = conn.execute(statements[0]).fetchall()
        assert [row[1] for row in rows] == ["stripe.charge"], "the audit query sees the example"
        for statement in statements[1:]:
            conn.execute(statement).fetchall()


def test_mysql_page_sets_up_audits_and_cleans_one_database(tmp_path: Path) -> None:
    """The page's `agent-ledger init`, its example and its audit SQL all work on one database."""
    require_mysql()
    page = ROOT / "docs" / "mysql.md"
    (init,) = [c for b in _blocks(page, "bash") for c in b.splitlines() if "agent-ledger init" in c]
    (example,) = _blocks(page, "python")
    (audit,) = _blocks(page, "sql")
    from tests.harness import _in_a_thread

    with _docs_database():
        url = _docs_mysql_url()
        command = init.replace('"mysql://root@127.0.0.1:3306/test"', f'"{url}"')
        assert command != init, "the page's init command names the test server's URL"
        done = subprocess.run(
            ["bash", "-c", command.replace("agent-ledger", f"{sys.executable} -m agent_ledger")],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{command}: {done.stderr}"
        from agent_ledger.stores.mysql import MYSQL_SCHEMA_VERSION

        version = _in_a_thread(
            lambda: _mysql_statement(
                f"SELECT MAX(version) FROM `{DOCS_DATABASE}`.agent_ledger_schema_version"
            )
        )
        assert version == [(MYSQL_SCHEMA_VERSION,)], "init put the tables in the docs' database"

        script = tmp_path / "example.py"
        script.write_text(example)
        done = _run_python(script, tmp_path)
        assert done.returncode == 0, done.stderr

        statements = [s for s in audit.split(";") if s.strip()]
        assert len(statements) == 3
        qualified = [
            s.replace("FROM agent_ledger_effects", f"FROM `{DOCS_DATABASE}`.agent_ledger_effects")
            for s in statements
        ]
        rows = _in_a_thread(lambda: _mysql_statement(qualified[0]))
        assert [row[1] for row in rows] == ["stripe.charge"], "the audit query sees the example"
        assert rows[0][2] == "succeeded" and rows[0][4] == 1, "the replay is counted"
        for statement in qualified[1:]:
            _in_a_thread(lambda s=statement: _mysql_statement(s))
