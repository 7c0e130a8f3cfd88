"""Instructions per approval cycle, counted by valgrind: a figure that load does not move.

On a shared 2-core machine the rate of a cycle, and even its CPU time, moves by a third from
one run of the same code to the next, which hides any change of a few percent. The number
of instructions the process executes does not move: this script counts them with
`valgrind --tool=callgrind` (user-space instructions of the whole process: the interpreter,
nodbot, pydantic, the sqlite3 library; not the kernel's work in system calls, so it is no
stand-in for the rate, whose SQLite part is mostly writes to the WAL).

For each workload it runs a child process twice under valgrind, with `--cycles` and with
three times as many cycles, and prints the difference divided by the extra cycles, so that
start-up and imports cancel out. The workloads: nodbot's cycle (pause, decide, resume, the
tool runs; `bench/cycle.py`'s) on the memory store and on a SQLite file, the floor
(three raw sqlite3 transactions a cycle), and `bot`: approvals one at a time through the
whole bot over HTTP (`bench/bot.py`'s bot, its webhook receiver in a process that is not
counted, the client in the counted one), per approval. The bot's lanes also poll every half
second, so its count moves by about 1% from run to run; the others' by 0.4%.

`--against REV` measures the nodbot workloads of the git revision REV too (checked out in a
temporary worktree), alternately with this tree's, and prints this tree's count over REV's:
the way to see what a change does to the cost of a cycle before measuring rates.

Needs valgrind (`apt-get install valgrind`); each workload takes about a minute (`bot`,
with `--cycles 10`, two and a half).
`.venv/bin/python bench/instructions.py --against HEAD~1`. It is not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

WORKLOADS = ("memory", "sqlite", "floor", "bot")
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")
WARMUP = 20
"""Cycles run before counting starts to matter (caches, statement caches, first plans)."""
BOT_WARMUP = 5
"""Approvals through the bot before counting starts to matter."""


# --- the child: one workload, run from a given tree --------------------------------------


def child(tree: Path, workload: str, cycles: int) -> None:
    """Run `WARMUP + cycles` cycles of `workload` with `nodbot` imported from `tree`."""
    sys.path.insert(0, str(tree))
    import nodbot as package

    imported = Path(package.__file__).resolve()
    if not imported.is_relative_to(tree.resolve()):
        raise SystemExit(f"nodbot was imported from {imported}, not from {tree}")
    # The workloads of bench/cycle.py, from this script's own tree: they are the measure.
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="nodbot-instructions-") as name:
        path = Path(name) / "cycles.db"
        if workload == "floor":
            floor(path, WARMUP + cycles)
        elif workload == "bot":
            asyncio.run(bot(path, BOT_WARMUP + cycles))
        else:
            asyncio.run(nodbot(workload, path, WARMUP + cycles))


async def nodbot(workload: str, path: Path, cycles: int) -> None:
    from bench.cycle import nodbot_cycles
    from nodbot.core import MemoryApprovalStore, SqlApprovalStore

    if workload == "memory":
        await nodbot_cycles(workload, MemoryApprovalStore(), cycles, 0)
        return
    store = SqlApprovalStore(f"sqlite:///{path}")
    try:
        await nodbot_cycles(workload, store, cycles, 0)
    finally:
        await store.close()


async def bot(path: Path, approvals: int) -> None:
    """bench/bot.py's bot on SQLite, its webhook receiver in a process of its own, and
    `approvals` approvals one after the other from a client in this process: `POST /runs`
    (the refund pauses and its review is posted), `POST .../decide`, `GET /runs/{id}?wait`
    until it has finished. The client's share is the same in every tree."""
    import secrets

    from bench import bot as driven
    from nodbot.bot import service

    # Under valgrind a turn of the event loop takes some fifty times as long, so a new run
    # would wait for its admission (a loop within ADMIT_LAG of its work) turn after turn,
    # and the count would measure that wait: it is taken out, in every tree alike.
    service.ADMIT_LAG = float("inf")

    os.environ[driven.TOKEN_VARIABLE] = token = secrets.token_urlsafe(24)
    os.environ[driven.HOOK_SECRET_VARIABLE] = secrets.token_urlsafe(24)
    async with driven.receiving() as receiver:
        config = driven.write_config(path.parent, f"sqlite:///{path}", receiver.url)
        async with (
            driven.serving(str(config)) as served,
            driven.api_client(served.url, token) as client,
        ):
            for number in range(approvals):
                run = await driven.start_run(client, f"order-{number}")
                [pending] = run["pending"]
                await driven.decide(client, pending["approval_id"])
                await driven.until_finished(client, run["run_id"])


def floor(path: Path, cycles: int) -> None:
    """bench/cycle.py's floor: insert a pending row, mark it decided, mark it consumed."""
    from bench.cycle import floor_cycles

    floor_cycles(path, cycles, 0)


# --- the parent: counts under valgrind ------------------------------------------------------


def count(tree: Path, workload: str, cycles: int) -> int:
    """Instructions of one child process running `cycles` cycles of `workload`."""
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        workload,
        "--tree",
        str(tree),
        "--cycles",
        str(cycles),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{workload} under valgrind failed ({done.returncode}):\n{done.stderr}")
    return int(found.group(1))


def per_cycle(tree: Path, workload: str, cycles: int) -> float:
    """Instructions per cycle: the count of 3 x `cycles` less that of `cycles`, per cycle."""
    return (count(tree, workload, 3 * cycles) - count(tree, workload, cycles)) / (2 * cycles)


@contextlib.contextmanager
def worktree(revision: str) -> Iterator[Path]:
    """A temporary checkout of `revision`, removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="nodbot-against-"))
    try:
        subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "worktree",
                "add",
                "--detach",
                "--quiet",
                str(folder),
                revision,
            ],
            check=True,
        )
        yield folder
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False
        )
        shutil.rmtree(folder, ignore_errors=True)


def report(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None:
        print("bench/instructions.py needs valgrind: apt-get install valgrind", file=sys.stderr)
        return 2
    workloads = [name for name in args.workloads.split(",") if name]
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        print(f"unknown workloads: {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
        return 2
    print(
        f"instructions per cycle (callgrind; {args.cycles} and {3 * args.cycles} cycles, "
        f"after {WARMUP} warm-up, the difference per extra cycle)"
    )
    with contextlib.ExitStack() as stack:
        trees = [("this tree", ROOT)]
        if args.against:
            trees.append((args.against, stack.enter_context(worktree(args.against))))
        counts: dict[tuple[str, str], float] = {}
        for workload in workloads:
            # The floor is raw sqlite3: the same in every tree, so counted once.
            measured = trees[:1] if workload == "floor" else trees
            for label, tree in measured:
                counts[workload, label] = per_cycle(tree, workload, args.cycles)
                print(f"{workload:<8} {label:<20} {counts[workload, label]:>14,.0f}")
    print()
    floor_count = counts.get(("floor", "this tree"))
    for workload, label in itertools.product(("memory", "sqlite"), [t[0] for t in trees]):
        if (workload, label) in counts and floor_count:
            ratio = counts[workload, label] / floor_count
            print(f"{workload} ({label}) / floor = {ratio:.1f}x the floor's instructions")
    if args.against:
        for workload in workloads:
            if workload != "floor":
                ratio = counts[workload, "this tree"] / counts[workload, args.against]
                print(f"{workload}: this tree / {args.against} = {ratio:.3f}")
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--cycles", type=int, default=100, help="cycles of the shorter run (default 100)"
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, of {', '.join(WORKLOADS)} (default all)",
    )
    parser.add_argument("--against", metavar="REV", help="a git revision to compare with")
    parser.add_argument("--child", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cycles < 1:
        parser.error("--cycles must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.tree, args.child, args.cycles)
        return 0
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
