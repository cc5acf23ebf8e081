"""Pictures: a Gantt chart of traced runs, and the plan as a graph.

* :func:`save_gantt` draws one row per stream (grouped by device), a bar
  per kernel (coloured by op), copies grey, waits as thin red bars, and run
  boundaries as faint spans. It needs matplotlib, an optional dependency
  (``pip install 'asyncrt[plot]'``); without it,
  :class:`~asyncrt.errors.MissingDependencyError` says so.
* :func:`save_plan_picture` renders :meth:`~scheduler.plan.Plan.to_dot`
  with graphviz's ``dot`` program where it is installed; where it is not,
  it writes the DOT text instead (next to the asked path, ``.dot``), which
  any graphviz viewer opens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler.plan import Plan
from scheduler.trace import RunTrace

from ..errors import ArgumentError, MissingDependencyError, RenderError

__all__ = ("save_gantt", "save_plan_picture")

_DOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
_DOT_TEXT = {".dot", ".gv"}
_DOT_TIMEOUT = 60.0
_COPY_COLOUR = "#9e9e9e"
_WAIT_COLOUR = "#424242"


def save_gantt(
    path: str | os.PathLike[str], runs: Sequence[RunTrace], *, title: str = ""
) -> Path:
    """Draw ``runs`` as a Gantt chart of the streams (PNG, SVG or PDF, by
    the file's suffix).

    :return: the path written.
    :raises MissingDependencyError: if matplotlib is not installed.
    :raises ArgumentError: if there is nothing to draw or the suffix is not
        one matplotlib writes here.
    :raises OSError: if the file cannot be written.
    """
    target = Path(path)
    if target.suffix.lower() not in _DOT_FORMATS:
        raise ArgumentError(
            f"{target}: a Gantt chart is written as .png, .svg or .pdf, "
            f"not {target.suffix or 'a file without suffix'!r}"
        )
    spans = [span for run in runs for span in run.spans]
    if not spans:
        raise ArgumentError("no traced run to draw")
    figure_class, colormaps = _matplotlib()
    origin = min(run.start for run in runs)
    rows = sorted(
        {(str(s.device), s.stream, s.label) for s in spans},
        key=lambda key: (key[0], key[1], key[2]),
    )
    row_of = {key: i for i, key in enumerate(rows)}
    ops = sorted({s.launch.func_name for s in spans if s.kind == "kernel" and s.launch})
    palette = colormaps["tab20"]
    colour = {op: palette(i % 20) for i, op in enumerate(ops)}
    # A bare Figure, not pyplot: no global state, no window, any backend.
    figure = figure_class(figsize=(12, 1.2 + 0.45 * len(rows)))
    axes = figure.add_subplot()
    for run in runs:
        axes.axvspan(
            1e3 * (run.start - origin),
            1e3 * (run.end - origin),
            color="#2196f3",
            alpha=0.05,
        )
    for span in spans:
        if span.kind == "record":
            continue
        row = row_of[str(span.device), span.stream, span.label]
        left, width = 1e3 * (span.start - origin), 1e3 * (span.end - span.start)
        if span.kind == "wait":
            axes.barh(row, width, left=left, height=0.08, color=_WAIT_COLOUR)
            continue
        launch_op = span.launch.func_name if span.launch else ""
        fill = _COPY_COLOUR if span.kind == "copy" else colour[launch_op]
        axes.barh(row, width, left=left, height=0.7, color=fill)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([f"{label} (s{stream})" for _, stream, label in rows])
    axes.invert_yaxis()
    axes.set_xlabel("time (ms)")
    axes.set_title(title or f"{len(runs)} run(s)")
    handles = [_patch(colour[op], op) for op in ops]
    handles.append(_patch(_COPY_COLOUR, "copy"))
    handles.append(_patch(_WAIT_COLOUR, "wait"))
    axes.legend(
        handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small"
    )
    figure.tight_layout()
    figure.savefig(target, dpi=120)
    return target


def save_plan_picture(plan: Plan, path: str | os.PathLike[str]) -> Path:
    """Write the plan as a graph: rendered by graphviz's ``dot`` for a
    ``.png``, ``.svg`` or ``.pdf`` path where ``dot`` is installed, else as
    DOT text (``.dot`` / ``.gv`` paths, or the asked path with ``.dot``
    when ``dot`` is missing).

    :return: the path written (check its suffix: ``.dot`` means text).
    :raises ArgumentError: for another suffix.
    :raises RenderError: if ``dot`` fails.
    :raises OSError: if the file cannot be written.
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in _DOT_FORMATS and suffix not in _DOT_TEXT:
        raise ArgumentError(
            f"{target}: a plan picture is .png, .svg, .pdf, .dot or .gv, "
            f"not {suffix or 'a file without suffix'!r}"
        )
    dot_text = plan.to_dot() + "\n"
    dot = shutil.which("dot") if suffix in _DOT_FORMATS else None
    if dot is None:
        if suffix in _DOT_FORMATS:
            target = target.with_suffix(".dot")
        target.write_text(dot_text, encoding="utf-8")
        return target
    try:
        done = subprocess.run(
            [dot, f"-T{_DOT_FORMATS[suffix]}", "-o", str(target)],
            input=dot_text.encode(),
            capture_output=True,
            timeout=_DOT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RenderError(f"graphviz dot took over {_DOT_TIMEOUT:.0f} s") from exc
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()
        raise RenderError(f"graphviz dot failed ({done.returncode}): {said}")
    return target


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib import colormaps
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError("a Gantt chart", "matplotlib", "plot") from exc
    return Figure, colormaps


def _patch(colour: Any, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, label=label)
