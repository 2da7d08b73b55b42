"""`tandem plan` writes SIMULATED figures with their provenance (loadtest/sim/plan.py)."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "loadtest" / "sim" / "configs" / "gpu-example.yaml"


def test_plan_writes_labelled_json_and_plot(tmp_path, capsys):
    rc = main(["plan", "--config", str(EXAMPLE), "--rates", "1", "--duration", "2", "--bandwidths-gbps", "10",
               "--long", "1024:16", "--short", "64:64", "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "plan.json").read_text())
    assert result["label"] == "SIMULATED"
    assert result["provenance"]["step_time"]["kind"] == "roofline_bound"
    assert "control_plane-issue27.json" in result["provenance"]["control_plane"]["tandem"]
    assert {r["system"] for r in result["rows"]} == {"adaptive", "always", "never", "colocated"}
    assert all(r["goodput_rps"] > 0 for r in result["rows"])  # a light load: every system serves it
    assert (tmp_path / "plan.png").stat().st_size > 0
    assert "SIMULATED" in capsys.readouterr().out
