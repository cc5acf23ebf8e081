"""Every code block of the README and of ``docs/`` stays true.

Python blocks run: in order, in one namespace per page (as a reader runs a
page top to bottom), in a fresh temporary folder, with warnings as errors
and the thread-leak check of every test. A block that cannot run here (it
needs a Dask cluster, certificates, a GPU) says so, and why, on the line
just before it: ``<!-- no-test: REASON -->``. Console blocks run nothing,
but every ``$ asyncrt ...`` line in them must parse with the command line's
own parser, so no example names a command or an option that does not exist.
Every block names its language.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncrt.cli._parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "console", "sh", "text")

_FENCE = re.compile(r"^```(\S*)\s*$")
_SKIP = re.compile(r"^<!--\s*no-test:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page.

    :ivar language: what follows the opening fence.
    :ivar code: its text.
    :ivar line: the line of its first text line (1-based).
    :ivar skip: why it does not run (the no-test marker), or ``None``.
    """

    language: str
    code: str
    line: int
    skip: str | None


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, in order."""
    found = []
    lines = page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        before = next((t for t in reversed(lines[:index]) if t.strip()), "")
        marker = _SKIP.match(before.strip())
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        found.append(
            Block(
                opening.group(1),
                "\n".join(lines[index + 1 : end]) + "\n",
                index + 2,
                marker.group(1) if marker else None,
            )
        )
        index = end + 1
    return found


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_pages_have_blocks_and_the_readme_opens_with_a_quickstart() -> None:
    assert (ROOT / "docs").is_dir() and len(PAGES) > 1
    first = next(b for b in blocks(ROOT / "README.md") if b.language == "python")
    assert "asyncio.run(" in first.code and first.skip is None


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_block_names_its_language_and_every_skip_a_reason(page: Path) -> None:
    for block in blocks(page):
        where = f"{_name(page)}:{block.line}"
        assert block.language in LANGUAGES, f"{where}: language {block.language!r}"
        if block.skip is not None:
            assert block.skip, f"{where}: a no-test marker needs a reason"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_console_examples_use_real_commands_and_options(page: Path) -> None:
    parser = build_parser()
    for block in blocks(page):
        if block.language not in ("console", "sh"):
            continue
        for text in block.code.splitlines():
            command = text.removeprefix("$ ").split("#")[0].strip()
            if not command.startswith("asyncrt ") or not text.startswith(
                ("$ ", "asyncrt ")
            ):
                continue
            try:
                parser.parse_args(shlex.split(command)[1:])
            except SystemExit as exc:
                raise AssertionError(
                    f"{_name(page)}:{block.line}: {command!r} does not parse"
                ) from exc


def test_the_quickstart_runs_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first = next(b for b in blocks(ROOT / "README.md") if b.language == "python")
    exec(compile(first.code, f"README.md:{first.line}", "exec"), {"__name__": "qs"})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_python_blocks_run_in_order(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for block in blocks(page):
        if block.language != "python" or block.skip is not None:
            continue
        code = compile(block.code, f"{_name(page)}:{block.line}", "exec")
        exec(code, namespace)
