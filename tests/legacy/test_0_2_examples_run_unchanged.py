"""agent-ledger 0.2.1's own examples run unchanged against this library and print what
0.2.1 printed (issue 26, item 11: basic_usage.py stopped at ``store.size``, then at
``store.list_effects()``; the OpenAI functions example crashed at
``store.list_effects()`` where 0.2.1 prints its audit trail). See
tests/legacy/v021_examples/NOTICE.md for where the examples come from."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).with_name("v021_examples")
#: The sha256 of each example in agent-ledger 0.2.1's sdist (NOTICE.md): unchanged.
SHA256 = {
    "basic_usage": "ce29bc23de79c4b8197ff37ccce54dce15b704bace8602070187d0e4c2d5fcca",
    "openai_functions_agent": "a9a45beee57999ce24517429378d49f2519b0d283100589b091954e934c90593",
}


@pytest.mark.parametrize("name", sorted(SHA256))
def test_the_examples_are_0_2_1s_byte_for_byte(name: str) -> None:
    data = (EXAMPLES / f"{name}.py.txt").read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256[name]


@pytest.mark.parametrize("name", sorted(SHA256))
def test_a_0_2_1_example_prints_what_it_printed_under_0_2_1(name: str, tmp_path: Path) -> None:
    if name == "openai_functions_agent":
        pytest.importorskip("openai", reason="the OpenAI example needs the openai extra")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "run_example.py"), name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = (EXAMPLES / f"{name}.v021-output.txt").read_text(encoding="utf-8")
    assert done.stdout == expected
    # What it meets here that changed is named, never a crash.
    assert "Traceback" not in done.stderr
