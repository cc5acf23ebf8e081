"""Measured figures: robust (the median of groups' best rounds), cached per
machine on disk, refreshed only when asked."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices import Device, cpu, get_api
from devices._figures import CACHE_ENV, REMEASURE_ENV, FigureCache, robust

MACHINE = {"host": "test", "cores": "2"}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(REMEASURE_ENV, raising=False)
    return tmp_path


class Counter:
    """A measurement that counts its calls and returns ``value``."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.value


def test_robust_is_the_median_of_each_groups_best() -> None:
    # a warm-up round, then 3 groups of 2: bests 9, 4, 7 -> median 7
    rounds = iter([100.0, 1.0, 9.0, 4.0, 2.0, 7.0, 3.0])
    assert robust(lambda: next(rounds), higher_is_better=True, groups=3, rounds=2) == 7
    # costs: the least of each group: 1, 2, 3 -> 2
    rounds = iter([100.0, 1.0, 9.0, 4.0, 2.0, 7.0, 3.0])
    assert robust(lambda: next(rounds), higher_is_better=False, groups=3, rounds=2) == 2


def test_one_freak_round_does_not_decide_a_figure() -> None:
    rounds = iter([0.0, 5.0, 1e12, 5.0, 6.0, 4.0, 5.0])
    assert robust(lambda: next(rounds), higher_is_better=True, groups=3, rounds=2) == 6


def test_a_figure_is_measured_once_per_machine(cache: Path) -> None:
    first = FigureCache("probe", MACHINE)
    measure = Counter(42.0)
    assert first.get("speed", measure) == 42.0
    assert first.get("speed", measure) == 42.0
    assert measure.calls == 1
    assert first.path.parent == cache and first.path.exists()
    assert str(first.path) in first.source
    # another process (a new cache object) reads the file: no measuring
    again = FigureCache("probe", MACHINE)
    assert again.get("speed", Counter(0.0)) == 42.0
    data = json.loads(again.path.read_text())
    assert data["figures"]["speed"]["value"] == 42.0
    # another machine does not
    other = FigureCache("probe", {**MACHINE, "cores": "64"})
    assert other.path != first.path
    assert other.get("speed", Counter(7.0)) == 7.0


def test_refresh_and_the_environment_measure_afresh(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = FigureCache("probe", MACHINE)
    figures.get("speed", Counter(1.0))
    figures.get("other", Counter(2.0))
    figures.refresh()
    assert figures.get("speed", Counter(3.0)) == 3.0
    assert FigureCache("probe", MACHINE).get("speed", Counter(0.0)) == 3.0
    # figures not measured again keep their old value in the file
    assert FigureCache("probe", MACHINE).get("other", Counter(0.0)) == 2.0
    monkeypatch.setenv(REMEASURE_ENV, "1")
    assert FigureCache("probe", MACHINE).get("speed", Counter(4.0)) == 4.0
    monkeypatch.delenv(REMEASURE_ENV)
    assert FigureCache("probe", MACHINE).get("speed", Counter(0.0)) == 4.0


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": 99}',
        json.dumps({"format": 1, "fingerprint": MACHINE, "figures": {"speed": -1}}),
        json.dumps(
            {
                "format": 1,
                "fingerprint": MACHINE,
                "figures": {"speed": {"value": "fast"}},
            }
        ),
    ],
)
def test_a_corrupt_cache_file_is_ignored_and_rewritten(cache: Path, text: str) -> None:
    figures = FigureCache("probe", MACHINE)
    figures.path.write_text(text)
    assert figures.get("speed", Counter(5.0)) == 5.0
    assert FigureCache("probe", MACHINE).get("speed", Counter(0.0)) == 5.0


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_cache_only_costs_the_cache(cache: Path) -> None:
    cache.chmod(0o500)
    try:
        figures = FigureCache("probe", MACHINE)
        assert figures.get("speed", Counter(5.0)) == 5.0
        assert "not writable" in figures.source
    finally:
        cache.chmod(0o700)


def test_a_cache_directory_that_is_a_file_only_costs_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "asyncrt"))
    figures = FigureCache("probe", MACHINE)
    assert figures.get("speed", Counter(5.0)) == 5.0
    assert "not writable" in figures.source


@pytest.fixture
def fresh_cpu_figures(cache: Path) -> Iterator[Path]:
    """The cpu backend's figures kept in ``cache``; the machine's own are
    read again afterwards."""
    cpu._figures.cache_clear()
    yield cache
    cpu._figures.cache_clear()


def test_the_cpu_plans_from_its_cached_figures(
    fresh_cpu_figures: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ("flops", "memory_bandwidth", "launch_overhead", "sync_latency")
    first = get_api("cpu").attributes(Device("cpu", 0))
    (path,) = fresh_cpu_figures.glob("cpu-*.json")
    assert str(path) in first["speed_source"]
    # a later process reads the file and measures nothing
    cpu._figures.cache_clear()

    def never() -> float:
        raise AssertionError("measured again")

    for probe in ("_matmul_flops", "_bandwidth", "_overhead", "_wake", "_issue"):
        monkeypatch.setattr(cpu, probe, never)
    again = get_api("cpu").attributes(Device("cpu", 0))
    assert {n: again[n] for n in names} == {n: first[n] for n in names}
    # remeasure() measures afresh when next asked
    monkeypatch.setattr(cpu, "_bandwidth", lambda: 1.5e10)
    cpu.remeasure()
    monkeypatch.setattr(cpu, "_matmul_flops", lambda: 2.5e10)
    monkeypatch.setattr(cpu, "_overhead", lambda: 1e-6)
    monkeypatch.setattr(cpu, "_wake", lambda: 2e-5)
    monkeypatch.setattr(cpu, "_issue", lambda: 3e-6)
    fresh = get_api("cpu").attributes(Device("cpu", 0))
    assert fresh["memory_bandwidth"] == 1.5e10
    assert fresh["flops"] == 2.5e10 * max(1, cpu._blas_threads())  # one core's
    assert fresh["issue_overhead"] == 3e-6
    assert cpu.figures_source() == fresh["speed_source"]
