"""Where the time of one approval cycle goes: `bench/cycle.py`'s cycle under cProfile.

The cycle is `bench/cycle.py`'s (pause, decide, resume, the tool runs once; new arguments
each cycle) on a SQLite file or the memory store, with a plain `def` tool (run in a thread,
the default), an `async def` tool, or a `def` tool declared `blocking=False`. After
`--warmup` cycles the script times `--cycles` cycles without the profiler (wall time, and
the CPU time of the process with all its threads), then profiles as many again with
cProfile, and prints:

- the profiled own time summed by category, in microseconds per cycle and as a share;
- the 25 functions with the most own time.

cProfile sees the event loop's thread only: the body of a `def` tool runs in a worker
thread (a trivial one here), and the loop's wait for it shows as the selector's wait. The
profiler adds a cost to every call, so many small calls weigh more than they do unprofiled:
read the shares, and the unprofiled figures for the scale.

Categories are decided from each function's module and name alone, so that two runs of the
same code sort alike (the first rule that matches wins):

- `sqlite3`: the methods of `sqlite3` connections and cursors, and the `sqlite3` package;
- `thread hop`: the hand-off of a synchronous tool to a thread and back: `asyncio.to_thread`,
  `run_in_executor`, `concurrent.futures`, `threading`, `queue`, the future chaining of
  `asyncio.futures`, `call_soon_threadsafe` and the loop's self-pipe, and `selectors` (the
  selector's wait; it also holds the loop's zero-timeout polls, which cost little);
- `validation`: pydantic and pydantic-core, `Tool.validate` and `core/arguments_schema.py`;
- `digests, canonical JSON`: `canonical_json` and `arguments_digest` in `core/tools.py`;
- `audit chain hashing`: `core/audit.py`;
- `store (Python around the SQL)`: `core/store.py` (the memory store too), `core/sqlstore/`,
  SQLAlchemy, aiosqlite, asyncpg;
- `executor and port`: the rest of nodbot (`core/executor.py`, `core/ports.py`,
  `core/calls.py`, `core/decisions.py`, ...);
- `the rest`: asyncio's loop and tasks, this script and `bench/cycle.py`, anything else.

Built-in functions (`~` in cProfile's terms: `json`'s encoder, `hashlib`, `hmac`, `dict`
methods, ...) and the standard library's plain helpers (`json`, `hashlib`, `hmac`,
`datetime`, `dataclasses`, `functools`, ...) belong to no category of their own: their own
time goes to their callers' categories, shared out by the time spent under each caller, so
that a `sha256` of the audit chain counts as the chain's and one of an argument digest as
the digest's.

`.venv/bin/python bench/profile_cycle.py --cycles 2000 --store sqlite --tool sync`.
It prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import sysconfig
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

ROOT = Path(__file__).resolve().parents[1]
# `python bench/profile_cycle.py` puts bench/ first on sys.path; the repository's root goes
# there instead, so that `bench.cycle` is found.
if sys.path and Path(sys.path[0] or os.curdir).resolve() == ROOT / "bench":
    sys.path[0] = str(ROOT)

from bench.cycle import TOOL_KINDS, TOOL_LABELS, RefundCycles, Stopwatch, ToolKind  # noqa: E402
from nodbot.core import ApprovalStore, MemoryApprovalStore, SqlApprovalStore  # noqa: E402

Function: TypeAlias = tuple[str, int, str]
"""cProfile's key of a function: file name, first line, name."""

SQLITE = "sqlite3"
HOP = "thread hop"
VALIDATION = "validation"
DIGESTS = "digests, canonical JSON"
AUDIT = "audit chain hashing"
STORE = "store (Python around the SQL)"
EXECUTOR = "executor and port"
REST = "the rest"
CATEGORIES = (SQLITE, HOP, VALIDATION, DIGESTS, AUDIT, STORE, EXECUTOR, REST)

TOP = 25
"""How many functions the list of the most own time shows."""

_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()
_NODBOT = ROOT.resolve()

# Modules of the standard library (relative to its folder) that are the thread hop, whole.
_HOP_MODULES = (
    "asyncio/threads.py",
    "asyncio/futures.py",
    "concurrent/futures/",
    "threading.py",
    "queue.py",
    "selectors.py",
)
# Functions of the event loop that are the thread hop: the executor and the self-pipe that
# wakes the loop when a thread hands a result back.
_HOP_FUNCTIONS = {
    ("asyncio/base_events.py", "run_in_executor"),
    ("asyncio/base_events.py", "call_soon_threadsafe"),
    ("asyncio/selector_events.py", "_write_to_self"),
    ("asyncio/selector_events.py", "_read_from_self"),
    ("asyncio/selector_events.py", "_process_self_data"),
}
# Site packages by the category they belong to (the first folder under site-packages).
_PACKAGES = {
    "pydantic": VALIDATION,
    "pydantic_core": VALIDATION,
    "sqlalchemy": STORE,
    "aiosqlite": STORE,
    "asyncpg": STORE,
}
_VALIDATION_FUNCTIONS = {"validate", "_field_errors"}
_DIGEST_FUNCTIONS = {"canonical_json", "arguments_digest"}


def _relative(path: str, base: Path) -> str | None:
    """`path` relative to `base` as a POSIX string, or None when it is not under it."""
    try:
        return Path(path).resolve().relative_to(base).as_posix()
    except ValueError:
        return None


def category_of(function: Function) -> str | None:
    """The category of a function by its module and name; None for a built-in or a plain
    helper of the standard library, whose time goes to its callers' categories."""
    filename, _, name = function
    if filename == "~":  # a built-in: only sqlite3's are a category of their own
        return SQLITE if "sqlite3." in name else None
    if filename.startswith("<"):  # frozen modules of the standard library
        return None
    mine = _relative(filename, _NODBOT)
    if mine is not None and not mine.startswith(".venv/"):
        return _nodbot_category(mine, name)
    parts = Path(filename).parts
    if "site-packages" in parts:
        package = parts[parts.index("site-packages") + 1 :][:1]
        return _PACKAGES.get(package[0].split(".")[0]) if package else None
    stdlib = _relative(filename, _STDLIB)
    if stdlib is None:
        return REST
    if stdlib.startswith("sqlite3/"):
        return SQLITE
    if stdlib.startswith(_HOP_MODULES) or (stdlib, name) in _HOP_FUNCTIONS:
        return HOP
    if stdlib.startswith("asyncio/"):
        return REST
    return None


def _nodbot_category(path: str, name: str) -> str:
    """The category of a function of this repository (`path` relative to its root)."""
    if path.startswith("bench/"):
        return REST
    if path in ("core/tools.py", "nodbot/core/tools.py"):
        if name in _VALIDATION_FUNCTIONS:
            return VALIDATION
        if name in _DIGEST_FUNCTIONS:
            return DIGESTS
        return EXECUTOR
    if path.endswith("core/arguments_schema.py"):
        return VALIDATION
    if path.endswith("core/audit.py") and "sqlstore" not in path:
        return AUDIT
    if path.endswith("core/store.py") or "core/sqlstore/" in path:
        return STORE
    return EXECUTOR


# --- the own time of each category ---------------------------------------------------------

Stats: TypeAlias = dict[Function, tuple[int, int, float, float, dict[Function, Any]]]


class Attribution:
    """Own time by category: a function's own category (`categorize`, a cycle's by default),
    or for one without (a built-in, a helper of the standard library) its callers', shared by
    the time under each caller. `categories` lists them all, `REST` among them."""

    def __init__(
        self,
        stats: Stats,
        categorize: Callable[[Function], str | None] = category_of,
        categories: Sequence[str] = CATEGORIES,
    ) -> None:
        self.stats = stats
        self._categorize = categorize
        self._categories = categories
        self._shares: dict[Function, dict[str, float]] = {}

    def shares(
        self, function: Function, seen: frozenset[Function] = frozenset()
    ) -> dict[str, float]:
        """The categories of `function`'s own time, as fractions that add up to one."""
        if function in self._shares:
            return self._shares[function]
        own = self._categorize(function)
        if own is not None:
            return {own: 1.0}
        callers = {
            caller: timing
            for caller, timing in self.stats[function][4].items()
            if caller not in seen and caller in self.stats
        }
        # A caller's entry is (calls, primitive calls, own time, cumulative time) under it.
        weights = {caller: timing[2] for caller, timing in callers.items()}
        if not sum(weights.values()):
            weights = {caller: float(timing[0]) for caller, timing in callers.items()}
        total = sum(weights.values())
        if not total:
            found = {REST: 1.0}
        else:
            found = defaultdict(float)
            for caller, weight in sorted(weights.items()):
                for category, part in self.shares(caller, seen | {function}).items():
                    found[category] += part * weight / total
        if not seen:  # only a share found without cutting a cycle short is kept
            self._shares[function] = dict(found)
        return dict(found)

    def by_category(self) -> dict[str, float]:
        """Seconds of own time by category."""
        totals = dict.fromkeys(self._categories, 0.0)
        for function, (_, _, own, _, _) in sorted(self.stats.items()):
            for category, part in self.shares(function).items():
                totals[category] += own * part
        return totals


def label(function: Function) -> str:
    """A function as `module.py:line(name)`, its path shortened to what tells it apart."""
    filename, line, name = function
    if filename == "~":
        return name
    for base in (_NODBOT, _STDLIB):
        relative = _relative(filename, base)
        if relative is not None and not relative.startswith(".venv/"):
            return f"{relative}:{line}({name})"
    parts = Path(filename).parts
    if "site-packages" in parts:
        return f"{'/'.join(parts[parts.index('site-packages') + 1 :])}:{line}({name})"
    return f"{filename}:{line}({name})"


def report(stats: Stats, cycles: int) -> None:
    """Print the categories and the functions with the most own time, per cycle."""
    attribution = Attribution(stats)
    totals = attribution.by_category()
    profiled = sum(totals.values())
    print()
    print(
        f"profiled own time (wall, the loop's thread) by category"
        f" ({profiled / cycles * 1e6:,.0f} µs/cycle in all)"
    )
    print(f"  {'category':<32} {'µs/cycle':>9} {'share':>7}")
    for category in sorted(CATEGORIES, key=lambda c: -totals[c]):
        micro = totals[category] / cycles * 1e6
        print(f"  {category:<32} {micro:>9,.1f} {totals[category] / profiled:>7.1%}")
    print()
    print(f"the {TOP} functions with the most own time")
    print(f"  {'own µs':>8} {'calls':>6} {'cum µs':>8}  {'category':<32} function")
    ranked = sorted(stats.items(), key=lambda item: (-item[1][2], item[0]))[:TOP]
    for function, (_, calls, own, cumulative, _) in ranked:
        shares = attribution.shares(function)
        main = max(shares, key=lambda c: (shares[c], c))
        named = main if category_of(function) else f"({main})"
        print(
            f"  {own / cycles * 1e6:>8.2f} {calls / cycles:>6.2f}"
            f" {cumulative / cycles * 1e6:>8.1f}  {named:<32} {label(function)}"
        )
    print("  (own and cumulative µs and calls per cycle; a category in brackets is the")
    print("  callers' of a built-in or standard-library helper)")


# --- the run -------------------------------------------------------------------------------


async def profile(store: ApprovalStore, kind: ToolKind, cycles: int, warmup: int) -> Stats:
    """Warm up, time `cycles` cycles, then profile as many again; print the timings."""
    bench = RefundCycles(store, kind)
    await bench.run(warmup)
    with Stopwatch() as watch:
        await bench.run(cycles)
    print(
        f"without the profiler: {watch.seconds / cycles * 1e6:,.0f} µs/cycle wall,"
        f" {watch.cpu_seconds / cycles * 1e6:,.0f} µs/cycle CPU (the process, every thread)"
    )
    profiler = cProfile.Profile()
    with Stopwatch() as watch:
        profiler.enable()
        await bench.run(cycles)
        profiler.disable()
    print(
        f"with the profiler:    {watch.seconds / cycles * 1e6:,.0f} µs/cycle wall,"
        f" {watch.cpu_seconds / cycles * 1e6:,.0f} µs/cycle CPU"
    )
    bench.check()
    stats: Stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    return stats


async def run(args: argparse.Namespace, tmp: Path) -> Stats:
    """Profile on the store `args` names (a SQLite file in `tmp`, closed at the end)."""
    if args.store == "memory":
        return await profile(MemoryApprovalStore(), args.tool, args.cycles, args.warmup)
    store = SqlApprovalStore(f"sqlite:///{tmp / 'profile.db'}")
    try:
        return await profile(store, args.tool, args.cycles, args.warmup)
    finally:
        await store.close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=2000, help="profiled cycles (default 2000)")
    parser.add_argument(
        "--warmup", type=int, default=200, help="cycles run before measuring (default 200)"
    )
    parser.add_argument("--store", choices=("memory", "sqlite"), default="sqlite")
    parser.add_argument(
        "--tool",
        choices=TOOL_KINDS,
        default="sync",
        help="sync: a plain def tool, run in a thread (the default); async: an async def"
        " tool; nonblocking: a def tool declared blocking=False",
    )
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.warmup < 0:
        parser.error("--cycles must be >= 1 and --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"one approval cycle under cProfile: store {args.store}, {TOOL_LABELS[args.tool]},"
        f" new arguments each cycle; {args.cycles} cycles after {args.warmup} warm-up"
    )
    with tempfile.TemporaryDirectory(prefix="nodbot-profile-") as name:
        stats = asyncio.run(run(args, Path(name)))
    report(stats, args.cycles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
