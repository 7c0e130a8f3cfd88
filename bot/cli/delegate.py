"""`nodbot delegate`: hand a reviewer's reviews to another person for a period (out of office).

```
nodbot delegate --config nodbot.yml --from ana@example.com --to bob@example.com \\
    --until 2027-01-10 --reason "holiday"
nodbot delegate list --config nodbot.yml [--all]
nodbot delegate end --config nodbot.yml dlg_0193...
```

A delegation is a row of the configuration's store, which every running bot on that store
reads when a delegate decides: it holds at once on every replica, without a restart, and
after one, until its `--until` (a date is its first moment, UTC: the day the reviewer is
back) or until it is ended. Standing delegations are the file's `delegations:`; `list`
shows them too. What a delegate may decide: `bot.policy.delegation`.
"""

from __future__ import annotations

import argparse
import getpass
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from nodbot.bot.config import Config, load_config
from nodbot.bot.policy.delegation import checked_delegation, standing_delegations
from nodbot.bot.store import store_for
from nodbot.core import ConfigurationError
from nodbot.core.delegations import Delegation
from nodbot.core.store import utc_now

__all__ = ["add_delegate_command", "run_delegate_command"]


def add_delegate_command(commands: Any) -> None:
    """Add `delegate` (and `delegate list`, `delegate end`) to the `nodbot` parser."""
    delegate = commands.add_parser(
        "delegate",
        help="hand a reviewer's reviews to another person for a while (out of office)",
        description="Hand FROM's reviews to TO until a date: meanwhile TO may decide what "
        "FROM could (never a call TO asked for), on every bot on the configuration's store, "
        "at once; FROM still may too. `delegate list` shows the delegations, `delegate end` "
        "ends one early.",
    )
    _config_option(delegate, argparse.SUPPRESS)
    delegate.add_argument("--from", dest="delegator", metavar="WHO", help="whose reviews")
    delegate.add_argument("--to", dest="delegate", metavar="WHO", help="who decides them")
    delegate.add_argument(
        "--until",
        metavar="WHEN",
        help="when it ends: a date (its first moment, UTC: the day they are back), such as "
        "2027-01-10, or a time such as 2027-01-10T09:00+01:00",
    )
    delegate.add_argument("--reason", metavar="TEXT", help="why, shown in the list")
    actions = delegate.add_subparsers(dest="delegate_action", metavar="ACTION")
    listing = actions.add_parser(
        "list",
        help="the delegations that hold or are to come",
        description="The delegations that hold now or are to come, the file's standing "
        "ones included; with --all, past and ended ones too.",
    )
    _config_option(listing, argparse.SUPPRESS)
    listing.add_argument("--all", action="store_true", help="past and ended ones too")
    end = actions.add_parser(
        "end",
        help="end a delegation now",
        description="End a delegation now, on every bot on the store (its id is in "
        "`nodbot delegate list`).",
    )
    _config_option(end, argparse.SUPPRESS)
    end.add_argument("delegation_id", metavar="ID", help="the delegation's id, dlg_...")


def _config_option(parser: argparse.ArgumentParser, default: Any) -> None:
    # Accepted before and after the action; the subcommands' default must not override the
    # value given before it (argparse copies a subparser's defaults over its parent's).
    parser.add_argument("-c", "--config", default=default, metavar="FILE", help="nodbot.yml")


async def run_delegate_command(arguments: argparse.Namespace) -> str:
    """Run one `delegate` command; returns what to print. Raises `ConfigurationError` for a
    bad input (nothing is written), `NodbotError`s."""
    action = arguments.delegate_action
    file = getattr(arguments, "config", "nodbot.yml")
    if action is None:
        return await _delegate(file, arguments)
    given = [
        option
        for option, value in (
            ("--from", arguments.delegator),
            ("--to", arguments.delegate),
            ("--until", arguments.until),
            ("--reason", arguments.reason),
        )
        if value is not None
    ]
    if given:
        raise ConfigurationError(f"delegate {action} takes no {', '.join(given)}")
    config = load_config(file)
    if action == "list":
        return await _list(config, everything=arguments.all)
    return await _end(config, file, arguments.delegation_id)


async def _delegate(file: str, arguments: argparse.Namespace) -> str:
    missing = [
        option
        for option, value in (
            ("--from", arguments.delegator),
            ("--to", arguments.delegate),
            ("--until", arguments.until),
        )
        if not value
    ]
    if missing:
        raise ConfigurationError(
            f"delegate needs {', '.join(missing)}: e.g. nodbot delegate --from ana@example.com "
            "--to bob@example.com --until 2027-01-10"
        )
    now = utc_now()
    try:
        asked = checked_delegation(
            arguments.delegator, arguments.delegate, arguments.until, arguments.reason, now=now
        )
    except ValueError as exc:
        raise ConfigurationError(f"delegate: {exc}") from None
    config = load_config(file)
    async with store_for(config) as store:
        made = await store.delegations.add(
            delegator=asked.delegator,
            delegate=asked.delegate,
            since=now,
            until=asked.until,
            reason=asked.reason,
            created_by=f"cli:{_os_user()}",
        )
    return (
        f"{made.delegator}'s reviews go to {made.delegate} until {_moment(asked.until)} "
        f"({made.delegation_id})"
    )


async def _list(config: Config, *, everything: bool) -> str:
    async with store_for(config) as store:
        stored = await store.delegations.list(live=not everything)
    found = [*standing_delegations(config), *stored]
    if not found:
        return "no delegations"
    return "\n".join(_line(delegation) for delegation in found)


async def _end(config: Config, file: str, delegation_id: str) -> str:
    if delegation_id.startswith("config:"):
        raise ConfigurationError(
            f"{delegation_id} is a standing delegation of {file}: remove it from delegations: there"
        )
    async with store_for(config) as store:
        ended = await store.delegations.end(delegation_id, by=f"cli:{_os_user()}")
    return f"ended: {ended.delegation_id} ({ended.delegator} -> {ended.delegate})"


def _line(delegation: Delegation) -> str:
    until = "until removed from the file" if delegation.until is None else "until "
    if delegation.until is not None:
        until += _moment(delegation.until)
    parts: Sequence[str] = [
        delegation.delegation_id,
        f"{delegation.delegator} -> {delegation.delegate}",
        until,
    ]
    if delegation.ended_at is not None:
        parts = [*parts, f"ended {_moment(delegation.ended_at)} by {delegation.ended_by}"]
    if delegation.reason:
        parts = [*parts, f"({delegation.reason})"]
    return "  ".join(parts)


def _moment(moment: datetime) -> str:
    if moment.hour == moment.minute == moment.second == 0:
        return f"{moment:%Y-%m-%d} (UTC)"
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER") or "unknown"
