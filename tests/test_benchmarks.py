"""The benchmarks still run (they print figures and are not tests, but they must not rot):
each is run here with the smallest workload."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import postgres_server_url

ROOT = Path(__file__).resolve().parents[1]


def test_the_bot_benchmark_runs_and_reports_every_figure() -> None:
    command = [sys.executable, "bench/bot.py", "--runs", "3", "--warmup", "0", "--sqlite-only"]
    command += ["--rounds", "2", "--no-peer"]  # the peer is installed from PyPI: not in tests
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in (
        "pending -> posted p99 =",
        "decision -> tool run p99 =",
        "under load, pending -> posted p99 =",
        "approvals end to end =",
        "the median of 2 rounds",
        "bot CPU per approval end to end =",
        "longest event-loop stall (one callback, CPU) =",
        "the longest callback in wall time",
        "a 1 ms timer's worst lateness",
        "awaithumans 0.1.12: not measured, so no ratio",
    ):
        assert figure in done.stdout, done.stdout


def test_the_bot_benchmark_with_the_bot_s_logs_keeps_them_out_of_its_report() -> None:
    command = [sys.executable, "bench/bot.py", "--runs", "3", "--warmup", "0", "--sqlite-only"]
    command += ["--rounds", "1", "--no-peer", "--logs"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "bot CPU per approval end to end =" in done.stdout, done.stdout
    # The bot logged (to a file of its own), not to the report.
    logged = re.search(r"\[sqlite\] the bot logged (\d+) lines, ([\d.]+) an approval", done.stdout)
    assert logged is not None and int(logged[1]) > 0, done.stdout
    for printed in (done.stdout, done.stderr):
        assert "nodbot.bot.http.access request" not in printed, printed


@pytest.mark.postgres
def test_the_notices_benchmark_runs_and_reports_every_figure() -> None:
    server = postgres_server_url()
    if server is None:
        pytest.skip("PostgreSQL tests need NODBOT_TEST_POSTGRES_URL (see docs/development.md)")
    command = [sys.executable, "bench/notices.py", "--decisions", "16", "--rounds", "2"]
    environment = {**os.environ, "NODBOT_BENCH_POSTGRES_URL": server}
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=environment
    )
    assert done.returncode == 0, done.stderr
    for figure in (
        "8 deciding at once, medians of 2 rounds:",
        "floor, NOTIFY inside",
        "floor, NOTIFY after",
        "nodbot decide, nobody else listens",
        "nodbot decide, another store listens",
        "x the floor)",
    ):
        assert figure in done.stdout, done.stdout


def test_the_request_api_benchmark_runs_and_reports_every_figure() -> None:
    command = [sys.executable, "bench/requests.py", "--round-trips", "4", "--concurrency", "2"]
    command += ["--rounds", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in (
        "[reviewed] request -> decided -> consumed =",
        "[ruled] request -> decided -> consumed =",
        "ms per round trip",
        "awaithumans",
    ):
        assert figure in done.stdout, done.stdout


def test_the_slack_benchmark_runs_and_reports_every_figure() -> None:
    command = [sys.executable, "bench/slack.py", "--runs", "2", "--posts", "2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in ("click -> tool run p99 =", "reviews posted ="):
        assert figure in done.stdout, done.stdout


def test_the_email_benchmark_runs_and_reports_every_figure() -> None:
    command = [sys.executable, "bench/mail.py", "--runs", "3", "--emails", "10", "--rounds", "1"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in ("reply -> tool run p99 =", "the floor's transaction", "review emails sent ="):
        assert figure in done.stdout, done.stdout


def test_the_repeat_under_load_script_counts_runs_and_stops_at_a_failure(tmp_path: Path) -> None:
    passing = tmp_path / "test_passes.py"
    passing.write_text("def test_it() -> None:\n    assert True\n")
    failing = tmp_path / "test_fails.py"
    failing.write_text("def test_it() -> None:\n    assert False, 'the failure it shows'\n")
    script = [sys.executable, "bench/repeat_under_load.py", "--busy", "1"]
    done = subprocess.run(
        [*script, "--runs", "2", str(passing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 2 runs passed with 1 busy processes" in done.stdout
    failed = subprocess.run(
        [*script, "--runs", "3", str(failing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode == 1
    assert "the failure it shows" in failed.stdout
    assert "0 of 3 runs passed" in failed.stdout


def test_the_open_reviews_benchmark_runs_and_reports_every_figure() -> None:
    command = [sys.executable, "bench/open_reviews.py", "--sizes", "0,20", "--sqlite-only"]
    command += ["--rounds", "1", "--cycles", "2"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "sqlite open reviews 0 -> 20: p50 ratio =" in done.stdout, done.stdout


def test_the_counts_benchmark_counts_the_store_work_of_each_approval() -> None:
    command = [sys.executable, "bench/counts.py", "--runs", "2", "--warmup", "0", "--sqlite-only"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in ("[sqlite] per approval, 2 approvals", "store operations", "insert_run"):
        assert figure in done.stdout, done.stdout
    # Each approval writes its run and reviews once, and the statements were traced.
    assert "    insert_run             1.00" in done.stdout, done.stdout
    assert "SQLite statements" in done.stdout and "write transactions" in done.stdout


def test_every_benchmark_starts_from_its_own_folder() -> None:
    # `python bench/x.py` puts bench/ first on sys.path: a script named like a module that
    # something imports (bench/email.py once shadowed the standard library's email) breaks
    # every script that does not put the repository's root there instead. --help loads each
    # with what it imports at the top. The awaithumans driver runs in awaithumans' own
    # environment, which has what it imports.
    scripts = [
        script
        for script in sorted(ROOT.glob("bench/*.py"))
        if "argparse" in script.read_text() and script.name != "awaithumans_driver.py"
    ]
    names = {script.name for script in scripts}
    assert {"bot.py", "cycle.py", "list_pending.py", "mail.py", "requests.py"} <= names
    for script in scripts:
        command = [sys.executable, str(script), "--help"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{script.name}: {done.stderr}"


def test_the_instruction_count_workloads_run_and_it_refuses_without_valgrind(
    tmp_path: Path,
) -> None:
    # What runs under valgrind: each workload as its child process runs it, from this tree.
    for workload in ("memory", "sqlite", "floor", "bot"):
        command = [sys.executable, "bench/instructions.py", "--child", workload, "--cycles", "3"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{workload}: {done.stderr}"
    # A tree that is not where nodbot is imported from is refused, not measured as another.
    command = [
        sys.executable,
        "bench/instructions.py",
        "--child",
        "memory",
        "--tree",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "nodbot was imported from" in done.stderr, done.stderr
    # Without valgrind on the PATH it says what to install, and counts nothing.
    without = {**os.environ, "PATH": str(tmp_path)}
    command = [sys.executable, "bench/instructions.py", "--workloads", "memory"]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=without
    )
    assert done.returncode == 2, done.stdout
    assert "apt-get install valgrind" in done.stderr
    assert "instructions per cycle" not in done.stdout


def test_the_cycle_benchmark_runs_and_reports_each_row_with_its_goal() -> None:
    command = [sys.executable, "bench/cycle.py", "--cycles", "3", "--warmup", "0"]
    command += ["--rounds", "1", "--no-postgres"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for figure in (
        "nodbot sqlite, def tool",
        "nodbot sqlite, async def tool",
        "nodbot sqlite, blocking=False",
        "floor sqlite3",
        "<= 5x",
        "CPU µs",
    ):
        assert figure in done.stdout, done.stdout
    assert re.search(r"\b(met|MISSED)\b", done.stdout), done.stdout


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_the_cycle_profile_runs_and_sums_the_time_by_category(store: str) -> None:
    command = [sys.executable, "bench/profile_cycle.py", "--cycles", "5", "--warmup", "0"]
    command += ["--store", store]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for figure in ("thread hop", "validation", "µs/cycle"):
        assert figure in done.stdout, done.stdout


def test_the_bot_benchmark_profiles_its_loop_when_asked(tmp_path: Path) -> None:
    command = [sys.executable, "bench/bot.py", "--runs", "3", "--warmup", "0", "--sqlite-only"]
    command += ["--rounds", "1", "--no-peer", "--profile", str(tmp_path / "bot.prof")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[sqlite] profile of the end-to-end rounds" in done.stdout, done.stdout
    assert "own us/approval" in done.stdout
    assert (tmp_path / "bot.prof.sqlite").stat().st_size > 0


@pytest.mark.postgres
def test_the_replicas_benchmark_runs_and_reports_every_figure() -> None:
    server = postgres_server_url()
    if server is None:
        pytest.skip("PostgreSQL tests need NODBOT_TEST_POSTGRES_URL (see docs/development.md)")
    command = [sys.executable, "bench/replicas.py", "--runs", "6", "--warmup", "0"]
    command += ["--rounds", "1", "--concurrency", "3"]
    environment = {**os.environ, "NODBOT_BENCH_POSTGRES_URL": server}
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment
    )
    assert done.returncode == 0, done.stderr
    # A round of 1 replica and one of 3, each with its CPU per approval, then the goals.
    # round, replicas, runs, seconds, approvals/s, CPU ms/approval, decided -> finished.
    row = r"\s+6\s+[\d.]+\s+[\d.,]+\s+[\d.]+\s+[\d.]+ / [\d.]+  [\d.]+"
    assert re.search(rf"^\s+1\s+1{row}$", done.stdout, re.M), done.stdout
    assert re.search(rf"^\s+2\s+3{row}, [\d.]+, [\d.]+$", done.stdout, re.M), done.stdout
    for figure in (
        "bot CPU per approval with 1 replica =",
        "(goal <= 2 ms:",
        "bot CPU per approval with 3 replicas =",
    ):
        assert figure in done.stdout, done.stdout
    ratio = r"bot CPU per approval with 3 replicas / with 1 = \d+\.\d\dx"
    ratio += r" \(goal <= 1\.2x: (met|MISSED)\)"
    assert re.search(ratio, done.stdout), done.stdout
