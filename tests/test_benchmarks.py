"""The benchmarks still run (they print figures and are not tests, but they must not rot):
each is run here with the smallest workload."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_bot_benchmark_runs_and_reports_every_figure() -> None:
    command = [sys.executable, "bench/bot.py", "--runs", "3", "--warmup", "0", "--sqlite-only"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in (
        "pending -> posted p99 =",
        "decision -> tool run p99 =",
        "approvals end to end =",
    ):
        assert figure in done.stdout, done.stdout


def test_the_slack_benchmark_runs_and_reports_every_figure() -> None:
    command = [sys.executable, "bench/slack.py", "--runs", "2", "--posts", "2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in ("click -> tool run p99 =", "reviews posted ="):
        assert figure in done.stdout, done.stdout
