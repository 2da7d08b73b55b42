"""The chart's Prometheus rules: valid (`promtool check rules`) and doing what they say
(`promtool test rules` on tests/prometheus/, alerts fed with recorded-looking series)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RULES = sorted((REPO / "deploy" / "helm" / "tandem" / "rules").glob("*.yaml"))
TESTS = sorted((REPO / "tests" / "prometheus").glob("*.test.yaml"))

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool missing: `make test` installs Debian's prometheus package")


def _promtool(*args: str) -> str:
    done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_rules_are_valid():
    assert RULES
    out = _promtool("check", "rules", *map(str, RULES))
    assert "SUCCESS" in out


def test_alert_unit_tests_pass():
    assert TESTS
    out = _promtool("test", "rules", *map(str, TESTS))
    assert "SUCCESS" in out and "FAILED" not in out


def test_every_alert_has_a_unit_test():
    import yaml

    alerts = {rule["alert"] for path in RULES for group in yaml.safe_load(path.read_text())["groups"]
              for rule in group["rules"] if "alert" in rule}
    tested = {case["alertname"] for path in TESTS for test in yaml.safe_load(path.read_text())["tests"]
              for case in test.get("alert_rule_test", [])}
    assert alerts - tested == set(), f"alerts without a promtool test: {sorted(alerts - tested)}"
