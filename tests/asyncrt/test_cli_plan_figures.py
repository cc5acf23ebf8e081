"""``asyncrt plan`` shows the cost figures its plan was made from."""

from __future__ import annotations

import json

import pytest

from asyncrt.cli import main
from devices import Device, get_api


def test_plan_shows_the_figures_it_used(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--device", "cpu", "--device", "sim:0", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    figures = {f["device"]: f for f in data["figures"]}
    assert set(figures) == {"cpu:0", "sim:0"}
    cpu = get_api("cpu").speed(Device("cpu", 0))
    assert figures["cpu:0"]["flops"] == cpu.flops
    assert figures["cpu:0"]["sync_latency_s"] == cpu.sync_latency
    assert figures["cpu:0"]["source"] == cpu.source != ""
    assert figures["sim:0"]["source"] == "sim configuration"
    code = main(["plan", "--device", "cpu", "--device", "sim:0"])
    assert code == 0
    text = capsys.readouterr().out
    assert "Planned from these figures" in text and "sim configuration" in text
