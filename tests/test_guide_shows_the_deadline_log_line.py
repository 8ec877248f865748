"""The guide's handler-deadline snippet prints a warning on stderr; the guide shows
that line (issue 30: a newcomer saw output the docs never mentioned)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.test_docs import _blocks, _text

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"


def test_the_deadline_snippet_prints_the_log_line_the_guide_shows(tmp_path: Path) -> None:
    text = _text(GUIDE)
    section = text[text.index("## Handler deadlines") :]
    snippet = next(b for b in _blocks(GUIDE, "python") if "HandlerTimeoutError" in b)
    assert snippet in section, "the first HandlerTimeoutError snippet is the section's"
    shown = re.search(r"<!-- deadline-log -->\n```text\n(.*?)\n```", section, flags=re.S)
    assert shown is not None, "the guide shows the log line after the snippet"
    script = tmp_path / "deadline.py"
    script.write_text(snippet)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr

    def masked(line: str) -> str:
        return re.sub(r"ended after \d+ ms", "ended after <n> ms", line)

    assert [masked(line) for line in done.stderr.splitlines()] == [masked(shown.group(1))]
