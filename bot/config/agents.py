"""Importing the agents a configuration names (`load_agents`) and checking the rules
against the tools they register (`check_agents`, and `report_agents`, which adds the
warnings). Loading a file never imports an agent: this module does, on request."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from nodbot.bot.config.models import Config, Rule
from nodbot.bot.config.predicates import ORIGINAL, BoundSpec
from nodbot.core import Agent
from nodbot.core.bridges.hosted import HostedAgent
from nodbot.core.questions import QUESTION_TOOL


def load_framework_agents(config: Config) -> tuple[dict[str, HostedAgent], list[str]]:
    """Import every agent of another framework the configuration names
    (`framework_agents:`), as `load_agents` does the bot's own: the agents that loaded, and
    one problem per entry that did not (or whose name is also under `agents:`)."""
    hosted: dict[str, HostedAgent] = {}
    problems: list[str] = []
    with _import_path_beside(config.source_file):
        for name, target in config.framework_agents.items():
            where = config.location(("framework_agents", name))
            if name in config.agents:
                problems.append(f"{where}: {name!r} is under agents: too; give each its own name")
                continue
            try:
                hosted[name] = _load_hosted(target)
            except _AgentError as exc:
                problems.append(f"{where}: {exc}")
    return hosted, problems


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


@dataclass(frozen=True)
class AgentReport:
    """What importing the agents and checking the rules against their tools found."""

    problems: list[str]
    """Why the file cannot be used as it is, each `<file>:<line>: <key>: <message>`."""
    warnings: list[str]
    """What works, but may not go as meant: an approve rule whose `when` names an argument
    its tool may be called without; a tool that asks for review (`confirm`) and that no
    rule covers for every call, so those calls go to `defaults:` or are denied."""


def check_agents(config: Config) -> list[str]:
    """Every problem found by importing the agents and checking the rules against their
    tools: a rule naming a tool no agent registers, an `editable`, `when` or `edit_bounds`
    naming an argument the tool does not take, a bound comparing values of kinds that never
    compare. Returns [] when all is well; never raises for a problem of the file.

    The rules are checked only when every agent loaded (a missing agent could hold the tool).
    """
    return report_agents(config).problems


def report_agents(config: Config) -> AgentReport:
    """The problems of `check_agents`, and the warnings: one per tool of an agent that asks
    for review and that no rule covers for every call (checked once the problems are none)."""
    agents, problems = load_agents(config)
    problems += load_framework_agents(config)[1]
    if problems:
        return AgentReport(problems, [])
    problems = _rule_problems(config, agents)
    warnings = (
        []
        if problems
        else [*_omitted_warnings(config, agents), *_coverage_warnings(config, agents)]
    )
    return AgentReport(problems, warnings)


def _rule_problems(config: Config, agents: Mapping[str, Agent]) -> list[str]:
    problems: list[str] = []
    for number, rule in enumerate(config.rules):
        if rule.tool == "*" or rule.tool in config.external_tools:
            continue  # external: its arguments are not known here
        holders = {name: agent for name, agent in agents.items() if rule.tool in agent.tools}
        if not holders and rule.tool == QUESTION_TOOL:
            problems.extend(_question_problems(config, number, rule))
            continue
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


QUESTION_FIELDS = frozenset({"question", "choices", "asked_by"})
"""What a rule of the pseudo-tool `ask` (questions to a person) may judge."""


def _question_problems(config: Config, number: int, rule: Rule) -> Iterator[str]:
    """The problems of a rule of the pseudo-tool `ask`: it must name people (a question is
    never decided by a rule: one that does is passed over), and its `when` may look at the
    question's fields only."""
    if rule.decision is not None:
        at = config.location(("rules", number, "decision"))
        yield (
            f"{at}: questions ({QUESTION_TOOL}) are answered by people: a rule of "
            f"{QUESTION_TOOL} names reviewers, not a decision"
        )
    if rule.when is not None:
        for argument in sorted(rule.when.argument_names() - QUESTION_FIELDS):
            at = config.location(("rules", number, "when"))
            fields = ", ".join(sorted(QUESTION_FIELDS))
            yield f"{at}: {argument!r} is not a field of a question: it has {fields}"
    if rule.editable:
        at = config.location(("rules", number, "editable"))
        yield f"{at}: a question is answered, not edited: editable does not apply"


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
    kinds = _argument_kinds(model)
    for index, bound in enumerate(rule.edit_bounds or []):
        at = config.location(("rules", number, "edit_bounds", index))
        unknown = sorted((bound.argument_names() | bound.references()) - set(arguments))
        for argument in unknown:
            yield f"{at}: {argument!r} is not an argument: {what}"
        if not unknown:
            yield from (f"{at}: {message}" for message in _bound_kind_problems(bound, kinds))


def _omitted_warnings(config: Config, agents: Mapping[str, Agent]) -> Iterator[str]:
    """One warning per approve rule whose `when` names an argument its tool (of an agent of
    the bot: the arguments of other tools are not known here) may be called without: such a
    call is judged with the argument's default, and one that default leaves unjudgeable
    (None, say) is not approved by the rule but goes on to the next one."""
    for number, rule in enumerate(config.rules):
        if rule.decision != "approve" or rule.when is None or rule.tool == "*":
            continue
        optional: dict[str, Any] = {}
        for agent in agents.values():
            if rule.tool in agent.tools:
                model = agent.tools.get(rule.tool).model
                for name, info in model.model_fields.items():
                    if not info.is_required():
                        optional[info.alias or name] = info.get_default(call_default_factory=False)
        for argument in sorted(rule.when.argument_names() & set(optional)):
            at = config.location(("rules", number, "when"))
            yield (
                f"{at}: warning: {rule.tool} may be called without {argument} (it then "
                f"takes its default, {optional[argument]!r}): this approve rule judges such "
                "a call by the default, and one it cannot judge by it (a missing or null "
                "value, another type) is not approved by it but goes on to the next rule, "
                "defaults: or a review; say in when what the default means, or make the "
                "argument required"
            )


def _coverage_warnings(config: Config, agents: Mapping[str, Agent]) -> Iterator[str]:
    """One warning per tool that asks for review and that no rule covers for every call."""
    fate = "are reviewed under defaults:" if config.defaults is not None else "are denied"
    for agent_name, agent in agents.items():
        for tool in agent.tools:
            if tool.confirm is False:
                continue
            asks = "confirm=True" if tool.confirm is True else "through its confirm rule"
            covering = [n for n, rule in enumerate(config.rules) if rule.tool in ("*", tool.name)]
            if any(config.rules[n].when is None for n in covering):
                continue
            if covering:
                listed = ", ".join(f"rules.{n}" for n in covering)
                what = f"only {listed} cover it, with when: the calls that match no when {fate}"
                fix = f"a rule for {tool.name} without when"
            else:
                what, fix = f"no rule covers it: its calls {fate}", f"a rule for {tool.name}"
            if config.defaults is None:
                what += f" (add {fix}, or a defaults: section)"
            at = config.location(("agents", agent_name))
            yield f"{at}: warning: {tool.name} asks for review ({asks}) and {what}"


def _argument_kinds(model: type[BaseModel]) -> dict[str, set[str]]:
    """The JSON kinds (number, string, boolean, null, array, object) each argument takes,
    for the arguments whose schema says it plainly."""
    properties = model.model_json_schema().get("properties") or {}
    kinds = {name: _schema_kinds(schema) for name, schema in properties.items()}
    return {name: found for name, found in kinds.items() if found}


def _schema_kinds(schema: Mapping[str, Any]) -> set[str]:
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        return {"number" if kind == "integer" else str(kind) for kind in types}
    if "anyOf" in schema:
        parts = [_schema_kinds(part) for part in schema["anyOf"]]
        return set().union(*parts) if all(parts) else set()
    if "enum" in schema or "const" in schema:
        return {_kind(value) for value in schema.get("enum", [schema.get("const")])}
    return set()  # a reference or anything else: not checked


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "null" if value is None else type(value).__name__


def _bound_kind_problems(bound: BoundSpec, kinds: Mapping[str, set[str]]) -> Iterator[str]:
    """A bound that no edit could meet, for the kinds of the arguments it compares."""
    name = bound.name
    if name in ("all", "any"):
        parts: list[BoundSpec] = getattr(bound, name)
        for part in parts:
            yield from _bound_kind_problems(part, kinds)
        return
    for argument, expected in bound.arguments_of(name).items():
        have = kinds.get(argument)
        if not have:
            continue
        if name in ("matches", "all_fields", "any_field"):
            if "string" not in have:
                kind = " or ".join(sorted(have))
                yield f"{name}: {argument} is {kind}, not a string: every edit would be refused"
            continue
        if isinstance(expected, Mapping):
            other = kinds.get(str(expected[ORIGINAL]), set())
            what = f"the original {expected[ORIGINAL]}"
        else:
            other, what = {_kind(expected)}, repr(expected)
        usable = have & other if name == "eq" else have & other & {"number", "string"}
        if other and not usable:
            yield (
                f"{name}: {argument} ({' or '.join(sorted(have))}) cannot be compared with "
                f"{what} ({' or '.join(sorted(other))}): every edit would be refused"
            )


class _AgentError(Exception):
    """Why an agent entry could not be loaded."""


def _load_agent(target: str) -> Agent:
    found = _load(target, lambda value: isinstance(value, Agent), "a core.Agent")
    assert isinstance(found, Agent)
    return found


def _load_hosted(target: str) -> HostedAgent:
    found = _load(target, _is_hosted, "a hosted agent (core.bridges.hosted.HostedAgent)")
    assert isinstance(found, HostedAgent)
    return found


def _is_hosted(value: object) -> bool:
    return not isinstance(value, type) and isinstance(value, HostedAgent)


def _load(target: str, accepts: Callable[[object], bool], what: str) -> object:
    """The object `target` names, or the one its zero-argument callable returns, when
    `accepts` it. Raises `_AgentError` saying why not."""
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
    if accepts(found):
        return found
    if not callable(found):
        raise _AgentError(
            f"{target} is {_described(found)}, not {what} or a zero-argument callable returning one"
        )
    return _call_factory(target, found, accepts, what)


def _call_factory(
    target: str, factory: Callable[..., Any], accepts: Callable[[object], bool], what: str
) -> object:
    with contextlib.suppress(TypeError, ValueError):  # builtins without a signature
        parameters = inspect.signature(factory).parameters.values()
        required = [
            p.name
            for p in parameters
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise _AgentError(
                f"{target} takes arguments ({', '.join(required)}); expected {what} "
                "or a zero-argument callable returning one"
            )
    try:
        made = factory()
    except Exception as exc:
        raise _AgentError(f"calling {target}() raised {type(exc).__name__}: {exc}") from None
    if inspect.iscoroutine(made):
        made.close()
        raise _AgentError(f"{target} is async; expected a plain callable returning {what}")
    if not accepts(made):
        raise _AgentError(f"{target}() returned {_described(made)}, not {what}")
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
