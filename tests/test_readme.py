"""Every Python snippet in the README runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets() -> None:
    """The extraction works, so the parametrized test below is not vacuous."""
    assert len(SNIPPETS) >= 5


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index: int, tmp_path: Path) -> None:
    """Each ```python block runs in a fresh interpreter without error."""
    script = tmp_path / f"snippet_{index}.py"
    script.write_text(SNIPPETS[index])
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, f"snippet {index} failed:\n{SNIPPETS[index]}\n{done.stderr}"


def test_readme_test_command_is_what_ci_runs() -> None:
    """The README's test command is the one .ci/run executes."""
    ci = (README.parent / ".ci" / "run").read_text()
    assert re.search(r"^\s*pytest\b", README.read_text(), flags=re.M)
    assert re.search(r"^[^#\n]*\bpytest\b", ci, flags=re.M)
