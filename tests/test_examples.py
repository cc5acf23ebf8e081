"""The examples run, end to end, and check their own results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("devices_tour.py", ["--size", "4096"]),
        ("devices_tour.py", ["--size", "4096", "--backend", "trio"]),
        ("heterogeneous.py", ["--streams", "1"]),
    ],
)
def test_example_runs(script: str, args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "max |error|" in done.stdout or "result" in done.stdout
