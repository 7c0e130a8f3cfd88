"""`nodbot runs start|show`: start a run of a configured agent from a shell, and look at one.

`start` takes the run as far as it goes without a person, in this process, and leaves it in
the store; a running bot (`nodbot serve` on the same configuration) continues it once its
calls are decided.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodbot.bot.config import (
    ConfigError,
    check_agents,
    load_agents,
    load_config,
    load_framework_agents,
)
from nodbot.bot.service import BotService, UnknownAgentError
from nodbot.bot.store import store_for
from nodbot.core import ConfigurationError, RunRecord, ToolMessage

__all__ = ["add_runs_commands", "run_runs_command"]


def add_runs_commands(commands: Any) -> None:
    """Add `runs start|show` to the `nodbot` parser."""
    runs = commands.add_parser("runs", help="start a run, or show one")
    actions = runs.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = actions.add_parser("start", help="start a run of a configured agent")
    start.add_argument("agent", help="the agent's name in the configuration")
    start.add_argument("input", help="what the person asks the agent")
    start.add_argument("--requested-by", help="who asks (may not approve the run's calls)")
    show = actions.add_parser("show", help="a run: status, answered calls, pending approvals")
    show.add_argument("run_id")
    for parser in (start, show):
        parser.add_argument("--config", default="nodbot.yml", metavar="FILE")


async def run_runs_command(arguments: argparse.Namespace) -> str:
    """Run one `runs` command; returns what to print. Raises `NodbotError`s."""
    config = load_config(arguments.config)
    problems = check_agents(config)
    if problems:
        raise ConfigError(problems)
    agents, _ = load_agents(config)
    hosted, _ = load_framework_agents(config)
    async with store_for(config) as store:
        service = BotService(config, store, agents, hosted=hosted)
        if arguments.action == "start":
            try:
                run = await service.start_run(
                    arguments.agent, arguments.input, arguments.requested_by
                )
            except UnknownAgentError as exc:
                raise ConfigurationError(str(exc)) from None
        else:
            run = await store.get_run(arguments.run_id)
        pending = await store.list(run_id=run.run_id, status="pending")
        return _describe(run, [record.approval_id for record in pending])


def _describe(run: RunRecord, pending: list[str]) -> str:
    lines = [f"run {run.run_id} of {run.agent}: {run.status}"]
    for message in run.messages:
        if isinstance(message, ToolMessage):
            arguments = json.dumps(message.arguments) if message.arguments else "(did not run)"
            lines.append(f"  {message.name} {arguments}: {message.content}")
    lines += [f"  waits for approval {approval_id}" for approval_id in pending]
    if run.final_text:
        lines.append(f"  answer: {run.final_text}")
    if run.error:
        lines.append(f"  error: {run.error}")
    return "\n".join(lines)
