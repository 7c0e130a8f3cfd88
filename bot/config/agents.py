"""Importing the agents a configuration names (`load_agents`) and checking the rules
against the tools they register (`check_agents`). Loading a file never imports an agent:
this module does, on request."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bot.config.models import Config, Rule
from core import Agent


def load_agents(config: Config) -> tuple[dict[str, Agent], list[str]]:
    """Import every agent of the configuration: the agents that loaded, and one problem per
    agent that did not (bad import path, import failure, not an Agent), each naming the
    file and line of its entry. Never raises for an agent's fault.

    The directory of the configuration file and the working directory are put on
    `sys.path` while importing, so `examples.support_agent:agent` is found beside the file.
    """
    agents: dict[str, Agent] = {}
    problems: list[str] = []
    with _import_path_beside(config.source_file):
        for name, target in config.agents.items():
            try:
                agents[name] = _load_agent(target)
            except _AgentError as exc:
                problems.append(f"{config.location(('agents', name))}: {exc}")
    return agents, problems


def check_agents(config: Config) -> list[str]:
    """Every problem found by importing the agents and checking the rules against their
    tools: a rule naming a tool no agent registers, an `editable` or `when` naming an
    argument the tool does not take. Returns [] when all is well; never raises for a
    problem of the file.

    The rules are checked only when every agent loaded (a missing agent could hold the tool).
    """
    agents, problems = load_agents(config)
    if problems:
        return problems
    for number, rule in enumerate(config.rules):
        if rule.tool == "*":
            continue
        holders = {name: agent for name, agent in agents.items() if rule.tool in agent.tools}
        if not holders:
            registered = sorted({tool.name for agent in agents.values() for tool in agent.tools})
            listed = ", ".join(registered) or "none"
            problems.append(
                f"{config.location(('rules', number, 'tool'))}: no agent registers a tool "
                f"named {rule.tool!r}; registered tools: {listed}"
            )
            continue
        for name, agent in holders.items():
            problems.extend(_argument_problems(config, number, rule, name, agent))
    return problems


def _argument_problems(
    config: Config, number: int, rule: Rule, agent_name: str, agent: Agent
) -> Iterator[str]:
    model = agent.tools.get(rule.tool).model
    arguments = [info.alias or name for name, info in model.model_fields.items()]
    what = f"tool {rule.tool!r} (agent {agent_name!r}) takes {', '.join(arguments) or 'none'}"
    for index, argument in enumerate(rule.editable or []):
        if argument not in arguments:
            at = config.location(("rules", number, "editable", index))
            yield f"{at}: {argument!r} is not an argument: {what}"
    if rule.when is not None:
        for argument in sorted(rule.when.argument_names() - set(arguments)):
            at = config.location(("rules", number, "when"))
            yield f"{at}: {argument!r} is not an argument: {what}"


class _AgentError(Exception):
    """Why an agent entry could not be loaded."""


def _load_agent(target: str) -> Agent:
    module_name, _, attribute = target.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise _AgentError(f"cannot import {module_name!r}: {exc}") from None
    except (Exception, SystemExit) as exc:
        raise _AgentError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise _AgentError(f"{module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if isinstance(found, Agent):
        return found
    if not callable(found):
        raise _AgentError(
            f"{target} is {_described(found)}, not a core.Agent or a zero-argument "
            "callable returning one"
        )
    return _call_factory(target, found)


def _call_factory(target: str, factory: Callable[..., Any]) -> Agent:
    with contextlib.suppress(TypeError, ValueError):  # builtins without a signature
        parameters = inspect.signature(factory).parameters.values()
        required = [
            p.name
            for p in parameters
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise _AgentError(
                f"{target} takes arguments ({', '.join(required)}); expected a core.Agent "
                "or a zero-argument callable returning one"
            )
    try:
        made = factory()
    except Exception as exc:
        raise _AgentError(f"calling {target}() raised {type(exc).__name__}: {exc}") from None
    if inspect.iscoroutine(made):
        made.close()
        raise _AgentError(f"{target} is async; expected a plain callable returning a core.Agent")
    if not isinstance(made, Agent):
        raise _AgentError(f"{target}() returned {_described(made)}, not a core.Agent")
    return made


def _described(value: object) -> str:
    if isinstance(value, type):
        return f"the class {value.__name__}"
    article = "an" if type(value).__name__[:1].lower() in "aeiou" else "a"
    return f"{article} {type(value).__name__}"


@contextlib.contextmanager
def _import_path_beside(file: str | None) -> Iterator[None]:
    """Put the configuration file's directory and the working directory on `sys.path`
    for the duration of the imports."""
    folders = [str(Path(file).resolve().parent)] if file is not None else []
    folders.append(os.getcwd())
    added = [folder for folder in dict.fromkeys(folders) if folder not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for folder in added:
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
