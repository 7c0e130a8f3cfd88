"""Run a test module again and again while busy processes keep every core loaded, and print
how many runs passed: tests that wait on a condition already true, or on a bare sleep, fail
here where they pass on a quiet machine.

    python bench/repeat_under_load.py                       # tests/bot/test_slack.py, 20 runs
    python bench/repeat_under_load.py tests/bot/test_identity.py --runs 5

It stops at the first failing run (its output is printed) and exits 1; the busy processes end
with it, whatever happens.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _spin() -> None:
    while True:
        pass


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("tests", nargs="*", default=["tests/bot/test_slack.py"])
    parser.add_argument("--runs", type=int, default=20, help="how many runs (default 20)")
    parser.add_argument(
        "--busy", type=int, default=os.cpu_count() or 2, help="busy processes (default: cores)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    passed = 0
    try:
        for number in range(1, args.runs + 1):
            started = time.monotonic()
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            result = subprocess.run(
                [*command, *args.tests], cwd=ROOT, capture_output=True, text=True, check=False
            )
            seconds = time.monotonic() - started
            last = (result.stdout.strip().splitlines() or ["(no output)"])[-1]
            print(f"run {number:2}: {'ok  ' if result.returncode == 0 else 'FAIL'} "
                  f"{seconds:5.1f} s  {last}", flush=True)  # fmt: skip
            if result.returncode != 0:
                print(result.stdout[-20_000:], result.stderr[-5_000:], sep="\n")
                break
            passed += 1
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()
    print(f"{passed} of {args.runs} runs passed with {args.busy} busy processes")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
