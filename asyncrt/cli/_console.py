"""How the command line talks: rich tables and colours on a terminal, plain
text when piped, JSON for machines, progress bars on stderr.

Results go to stdout; notes, progress and errors to stderr, so piping the
output (or ``--json``) gives only the result.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from rich.box import SIMPLE_HEAD
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from ..tools._time_evaluator import Progress as ProgressCallback

__all__ = ("Output", "jsonable")

#: Width of piped output: wide enough that tables keep one line per row.
_PIPED_WIDTH = 200


class Output:
    """The two streams of the command line.

    :param json_mode: print only JSON on stdout (notes still go to stderr).
    """

    def __init__(self, *, json_mode: bool = False) -> None:
        self.json_mode = json_mode
        probe = Console()
        width = None if probe.is_terminal else _PIPED_WIDTH
        self.out = Console(highlight=False, width=width)
        # soft_wrap: a note or an error stays one line, whatever the width.
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    def json(self, data: Any) -> None:
        """Print ``data`` as JSON on stdout."""
        print(json.dumps(jsonable(data), indent=2))

    def line(self, text: str = "", style: str | None = None) -> None:
        """Print a line of results (plain text, never markup)."""
        if not self.json_mode:
            self.out.print(escape(text), style=style)

    def note(self, text: str) -> None:
        """A note on stderr (what was assumed, where files went)."""
        self.err.print(escape(text), style="dim")

    def error(self, text: str) -> None:
        """The one-line error report on stderr."""
        self.err.print(f"[bold red]asyncrt: error:[/] {escape(text)}")

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        title: str | None = None,
        numeric: Sequence[str] = (),
        wrap: Sequence[str] = (),
    ) -> None:
        """Print a table of results.

        :param numeric: columns to right-align.
        :param wrap: columns that may wrap (the others stay on one line).
        """
        if self.json_mode:
            return
        table = Table(box=SIMPLE_HEAD, title=title, title_justify="left")
        for column in columns:
            table.add_column(
                column,
                justify="right" if column in numeric else "left",
                no_wrap=column not in wrap,
                overflow="fold",
            )
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        self.out.print(table)

    @contextmanager
    def progress(self, description: str, total: int) -> Iterator[ProgressCallback]:
        """A progress bar on stderr (shown on a terminal only); yields the
        callback to report (done, total) to."""
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.err,
            transient=True,
            disable=not self.err.is_terminal,
        )
        task = bar.add_task(description, total=total)

        def report(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        with bar:
            yield report


def jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot hold made plain: tuples as lists,
    infinities and NaN as strings, numpy scalars as numbers, other objects
    as text."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return jsonable(value.item())
    return str(value)
