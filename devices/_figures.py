"""Measured figures, taken robustly and cached per machine on disk.

A backend that measures its own speed (the cpu: its matmul throughput,
memory bandwidth, call, issue and wake-up costs) used to time each figure
once per process, once: on a busy virtual machine the same figure read
3.7 to 159 GFLOP/s from one process to the next, and plans flipped with it.
So a figure is now

* **measured robustly** (:func:`robust`): several groups of a few rounds,
  the best round of each group, and the median of those. A figure is meant
  to say what the machine can do, not what a neighbour left of it at one
  instant: on this project's shared two-core machine, rounds of the matmul
  probe read 150 GFLOP/s one time in four and 2 to 30 the others (a BLAS
  pool of two threads stalls whenever one core is taken), so a plain
  median read 3 to 111 GFLOP/s from one process to the next, while the
  median of the groups' best stays near 150; one freak round cannot decide
  it either, as it would a plain best;
* **measured once per machine**: kept in a small JSON file under the user's
  cache directory (``$ASYNCRT_CACHE_DIR``, else ``$XDG_CACHE_HOME/asyncrt``,
  else ``~/.cache/asyncrt``), one file per machine fingerprint (host name,
  processor, core count, numpy and BLAS builds), so every later process
  plans from the very same figures;
* **refreshed only when asked**: :meth:`FigureCache.refresh` (for the cpu,
  :func:`devices.cpu.remeasure`), or ``ASYNCRT_REMEASURE=1`` in the
  environment of a process, which then measures every figure afresh and
  rewrites the file.

The file is written atomically (a temporary file renamed over the old one),
so processes that measure at the same time never read half a file; one that
is unreadable, corrupt or of another machine is ignored and rewritten; a
directory that cannot be written only costs the cache (the figures are still
measured and kept for the process).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = (
    "CACHE_ENV",
    "GROUPS",
    "REMEASURE_ENV",
    "ROUNDS_PER_GROUP",
    "FigureCache",
    "cache_dir",
    "median_of",
    "robust",
)

#: The environment variable that names the cache directory.
CACHE_ENV = "ASYNCRT_CACHE_DIR"
#: The environment variable that makes a process measure afresh ("1").
REMEASURE_ENV = "ASYNCRT_REMEASURE"

#: Groups of rounds :func:`robust` takes, and rounds in each.
GROUPS = 5
ROUNDS_PER_GROUP = 4

_FORMAT = 1


def cache_dir() -> Path:
    """Where measured figures are cached (see the module docstring)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "asyncrt"


def median_of(samples: Iterable[float]) -> float:
    """The median of some rounds of a measurement.

    :raises ValueError: if there are none.
    """
    values = list(samples)
    if not values:
        raise ValueError("no samples")
    return float(statistics.median(values))


def robust(
    one_round: Callable[[], float],
    *,
    higher_is_better: bool,
    groups: int = GROUPS,
    rounds: int = ROUNDS_PER_GROUP,
) -> float:
    """A figure measured robustly: the median over ``groups`` groups of the
    best of ``rounds`` rounds each, after one round to warm up (see the
    module docstring).

    :param one_round: measures the figure once.
    :param higher_is_better: whether the best round is the highest
        (a throughput) or the lowest (a cost in seconds).
    :param groups: groups of rounds.
    :param rounds: rounds per group.
    """
    pick = max if higher_is_better else min
    one_round()  # threads wake up, pages fault in, caches fill
    bests = []
    for _ in range(groups):
        bests.append(pick(one_round() for _ in range(rounds)))
        time.sleep(1e-3)  # the next group meets the machine a little later
    return median_of(bests)


def _remeasure_asked() -> bool:
    return os.environ.get(REMEASURE_ENV, "").strip() not in ("", "0")


class FigureCache:
    """The figures of one backend on this machine, by name.

    Thread-safe: a figure is measured by one thread while the others wait
    for it.

    :param name: the backend's name, the start of the file's name.
    :param fingerprint: what identifies this machine and its libraries; a
        file made under another fingerprint is ignored.
    """

    def __init__(self, name: str, fingerprint: Mapping[str, str]) -> None:
        self._name = name
        self._fingerprint = dict(sorted(fingerprint.items()))
        digest = hashlib.sha256(
            json.dumps(self._fingerprint, sort_keys=True).encode()
        ).hexdigest()[:16]
        self._file = f"{name}-{digest}.json"
        self._lock = threading.RLock()
        self._figures: dict[str, float] = {}
        self._measured_at: dict[str, str] = {}
        self._fresh = _remeasure_asked()  # measure afresh, ignore the file
        self._writable = True

    @property
    def path(self) -> Path:
        """The cache file."""
        return cache_dir() / self._file

    @property
    def source(self) -> str:
        """Where the figures read so far came from, for people: the file
        and when they were measured."""
        with self._lock:
            dates = sorted(set(self._measured_at.values()))
            if not dates:
                return ""
            when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
            if not self._writable:
                return f"measured {when} (cache {self.path} not writable)"
            return f"{self.path} (measured {when})"

    def get(self, key: str, measure: Callable[[], float]) -> float:
        """Figure ``key``: known to this process, else from the cache file,
        else ``measure()`` now (and stored in the file).

        :param key: the figure's name.
        :param measure: measures it (robustly: see :func:`median_of`).
        """
        with self._lock:
            value = self._figures.get(key)
            if value is not None:
                return value
            if not self._fresh:
                stored = self._load()
                if key in stored:
                    value, when = stored[key]
                    self._figures[key], self._measured_at[key] = value, when
                    return value
            value = float(measure())
            when = datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"
            )
            self._figures[key], self._measured_at[key] = value, when
            self._writable = self._store()
            return value

    def refresh(self) -> None:
        """Forget every figure: each is measured afresh when next asked for,
        and the file rewritten."""
        with self._lock:
            self._figures.clear()
            self._measured_at.clear()
            self._fresh = True

    # -- the file ------------------------------------------------------------

    def _load(self) -> dict[str, tuple[float, str]]:
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if (
            not isinstance(data, dict)
            or data.get("format") != _FORMAT
            or data.get("fingerprint") != self._fingerprint
            or not isinstance(data.get("figures"), dict)
        ):
            return {}
        found: dict[str, tuple[float, str]] = {}
        for key, entry in data["figures"].items():
            if (
                isinstance(entry, dict)
                and isinstance(entry.get("value"), (int, float))
                and math.isfinite(entry["value"])
                and entry["value"] > 0
            ):
                found[key] = (float(entry["value"]), str(entry.get("measured", "")))
        return found

    def _store(self) -> bool:
        """Add this process's figures to the file; whether it could be
        written."""
        stored = self._load()
        # The figures this process holds replace the file's.
        figures = {k: {"value": v, "measured": w} for k, (v, w) in stored.items()}
        for name, figure in self._figures.items():
            figures[name] = {"value": figure, "measured": self._measured_at[name]}
        data = {
            "format": _FORMAT,
            "fingerprint": self._fingerprint,
            "figures": dict(sorted(figures.items())),
        }
        try:
            directory = self.path.parent
            directory.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(
                prefix=f".{self._name}-", suffix=".tmp", dir=directory
            )
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as out:
                    json.dump(data, out, indent=1)
                os.replace(temporary, self.path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError:
            return False
        return True
