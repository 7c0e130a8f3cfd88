"""`nodbot rules explain|test|diff`: what the rules of a configuration make of a call, before
the configuration ships.

```
nodbot rules explain --config nodbot.yml --tool refund --arguments '{"amount": 500}'
nodbot rules test --config nodbot.yml examples/rules_cases.yml
nodbot rules diff old.yml new.yml examples/rules_cases.yml
```

Each call is put to the rules as the bot puts its live calls (`bot.policy.explain`). A cases
file is a YAML list of calls with what is expected of each; `test` exits 0 when every case
holds, 1 when one does not, 2 for a bad file (`<file>:<line>: <key>: <problem>`, as for a
configuration). `diff` exits 0 when no case changes outcome or reviewers, 1 when one does.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TextIO

import yaml
from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictInt, StrictStr, ValidationError

from nodbot.bot.config import Config, ConfigError, load_agents, load_config
from nodbot.bot.config.errors import KeyPath, dotted
from nodbot.bot.policy.explain import Explanation, ReviewPlan, explain, format_duration
from nodbot.core import ConfigurationError, ToolRegistry

__all__ = ["add_rules_commands", "load_cases", "run_rules_command"]

MAX_CASES_BYTES = 1_000_000
MAX_CASES = 5_000
_MAX_NODES = 200_000  # values in a cases file at most: more is an alias bomb, refused
_MAX_INPUT = 1_000_000  # bytes of --arguments or --schema


# --- the cases file --------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expect(_Strict):
    """What a case expects of the rules."""

    outcome: Literal["approve", "deny", "review"]
    """approve or deny (at once), or review (by a person)."""
    rule: StrictInt | StrictStr | None = None
    """The rule that decides: its position in the file (from 0), `defaults`, `none` (no rule
    covers the call), or its description. Absent: not checked."""
    reviewers: list[StrictStr] | None = None
    """Who reviews, in any order; `group:<name>` stands for the group's members. Absent:
    not checked."""


class Case(_Strict):
    """One call and what the rules are expected to make of it."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    tool: Annotated[StrictStr, Field(min_length=1, max_length=200)]
    arguments: dict[str, JsonValue] = Field(default_factory=dict)
    requested_by: StrictStr | None = None
    """Who started the run (the self-approval check)."""
    agent: StrictStr | None = None
    """The bot's agent that calls the tool: its tool's model checks the arguments. Absent:
    the tool of whichever agent has it, as the bot does; a tool of none is taken as given."""
    expect: Expect


@dataclass(frozen=True)
class LoadedCase:
    """A case and the line it starts on."""

    case: Case
    line: int


def load_cases(path: str) -> list[LoadedCase]:
    """The cases of a cases file. Raises `ConfigError` listing every problem as
    `<file>:<line>: <key>: <problem>`."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the file: {exc.strerror or exc}"]) from None
    if len(raw) > MAX_CASES_BYTES:
        raise ConfigError([f"{path}:1: (top level): larger than {MAX_CASES_BYTES} bytes"])
    try:
        text = raw.decode("utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines: dict[KeyPath, int] = {}
        if node is not None:
            _record_lines(node, (), lines, [0])
        data = yaml.safe_load(text)
    except UnicodeDecodeError:
        raise ConfigError([f"{path}:1: (top level): the file is not UTF-8 text"]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigError([f"{path}:{line}: malformed YAML: {exc.problem}"]) from None
    except (yaml.YAMLError, _TooLarge) as exc:
        raise ConfigError([f"{path}:1: (top level): {exc or 'too many values'}"]) from None
    if not isinstance(data, list) or not data:
        raise ConfigError([f"{path}:1: (top level): expected a list of cases (name, tool, ...)"])
    if len(data) > MAX_CASES:
        raise ConfigError([f"{path}:1: (top level): more than {MAX_CASES} cases"])

    def at(loc: KeyPath, message: str) -> str:
        for end in range(len(loc), -1, -1):
            if loc[:end] in lines:
                return f"{path}:{lines[loc[:end]]}: {dotted(loc)}: {message}"
        return f"{path}:1: {dotted(loc)}: {message}"

    found: list[str] = []
    cases: list[LoadedCase] = []
    names: dict[str, int] = {}
    for index, item in enumerate(data):
        try:
            case = Case.model_validate(item)
        except ValidationError as exc:
            for error in exc.errors(include_url=False):
                loc = (index, *(p for p in error["loc"] if p != "[key]"))
                found.append(at(loc, _message(error)))
            continue
        first = names.setdefault(case.name, index)
        if first != index:
            found.append(at((index, "name"), f"the name {case.name!r} is taken by case {first}"))
        cases.append(LoadedCase(case, lines.get((index,), 1)))
    if found:
        raise ConfigError(found)
    return cases


class _TooLarge(Exception):
    def __str__(self) -> str:
        return f"the document expands to more than {_MAX_NODES} values"


def _record_lines(
    node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], count: list[int]
) -> None:
    """The line of every list item and key below `node`, by its path."""
    count[0] += 1
    if count[0] > _MAX_NODES:
        raise _TooLarge
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(item, (*path, index), lines, count)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                lines.setdefault((*path, key.value), key.start_mark.line + 1)
                _record_lines(value, (*path, key.value), lines, count)


def _message(error: Any) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown key; expected name, tool, arguments, requested_by, agent, expect"
    if error["type"] == "missing":
        return f"the required key {error['loc'][-1]!r} is missing"
    value = error.get("input")
    shown = f", not {value!r}" if isinstance(value, (str, int, float, bool)) else ""
    return f"{error['msg']}{shown}"


# --- the commands ----------------------------------------------------------------------------


def add_rules_commands(commands: Any) -> None:
    """Add `rules explain|test|diff` to the `nodbot` parser."""
    rules = commands.add_parser(
        "rules",
        help="explain, test and compare what the rules make of calls",
        description="Put calls to a configuration's rules as the bot puts its live calls, "
        "without recording anything or asking Slack.",
    )
    actions = rules.add_subparsers(dest="action", metavar="ACTION", required=True)
    explaining = actions.add_parser(
        "explain",
        help="which rule takes a call, why the earlier ones did not, and what happens",
        description="Which rule takes one call, why each earlier rule did not, and what "
        "happens: approved or denied at once, or reviewed (by whom, where, until when, with "
        "which bounds and quorum).",
    )
    explaining.add_argument("--config", default="nodbot.yml", metavar="FILE", help="nodbot.yml")
    explaining.add_argument("--tool", required=True, help="the tool's name")
    explaining.add_argument(
        "--arguments", default="{}", metavar="JSON", help="the call's arguments, a JSON object"
    )
    explaining.add_argument("--requested-by", metavar="WHO", help="who started the run")
    explaining.add_argument(
        "--agent",
        metavar="NAME",
        help="the agent of the file that calls the tool (default: whichever has the tool)",
    )
    explaining.add_argument(
        "--schema",
        metavar="FILE",
        help="a JSON schema of the arguments, as a caller of a tool that runs elsewhere "
        "sends it (POST /approvals)",
    )
    explaining.add_argument("--json", action="store_true", help="print JSON (keys in the docs)")
    testing = actions.add_parser(
        "test",
        help="run a file of cases against the rules; exit 1 when one does not hold",
        description="Run each case of a cases file (a YAML list of calls with the outcome, "
        "rule and reviewers expected) and print one line per case.",
        epilog="exit status: 0 every case holds; 1 a case does not; 2 a bad input (the "
        "command line, the configuration, the cases file).",
    )
    testing.add_argument("--config", default="nodbot.yml", metavar="FILE", help="nodbot.yml")
    testing.add_argument("cases", metavar="CASES", help="the cases file, e.g. rules_cases.yml")
    comparing = actions.add_parser(
        "diff",
        help="which cases change outcome between two configurations",
        description="Put each case of a cases file to the rules of OLD and of NEW and print "
        "what each makes of it; the expectations of the file are not read.",
        epilog="exit status: 0 no case changes outcome or reviewers; 1 some do; 2 a bad "
        "input (the command line, a configuration, the cases file).",
    )
    comparing.add_argument("old", metavar="OLD", help="the configuration as it is")
    comparing.add_argument("new", metavar="NEW", help="the configuration as it would be")
    comparing.add_argument("cases", metavar="CASES", help="the cases file")


async def run_rules_command(arguments: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one `rules` command, printing to `out` (stdout); returns the exit status. Raises
    `ConfigError` and `ConfigurationError` for a bad input."""
    out = out or sys.stdout
    if arguments.action == "explain":
        bot = _Bot(load_config(arguments.config))
        given = _json_object(arguments.arguments, "--arguments")
        schema = None if arguments.schema is None else _schema(arguments.schema)
        found = await bot.explain(
            arguments.tool, given, arguments.agent, arguments.requested_by, schema
        )
        if arguments.json:
            print(json.dumps(found.to_json(), indent=2, ensure_ascii=False), file=out)
        else:
            print("\n".join(describe(found)), file=out)
        return 0
    if arguments.action == "test":
        bot = _Bot(load_config(arguments.config))
        cases = load_cases(arguments.cases)
        bot.check_cases(cases, arguments.cases)
        failed = 0
        for loaded in cases:
            case = loaded.case
            found = await bot.explain(case.tool, case.arguments, case.agent, case.requested_by)
            differences = list(_differences(case, found, bot.config))
            failed += bool(differences)
            if differences:
                print(f"FAIL {case.name}: {'; '.join(differences)}", file=out)
            else:
                print(f"ok   {case.name}: {found.summary()}", file=out)
        print(f"{len(cases)} cases: {len(cases) - failed} ok, {failed} failed", file=out)
        return 1 if failed else 0
    old, new = _Bot(load_config(arguments.old)), _Bot(load_config(arguments.new))
    cases = load_cases(arguments.cases)
    old.check_cases(cases, arguments.cases)
    new.check_cases(cases, arguments.cases)
    changed = 0
    for loaded in cases:
        case = loaded.case
        before = await old.explain(case.tool, case.arguments, case.agent, case.requested_by)
        after = await new.explain(case.tool, case.arguments, case.agent, case.requested_by)
        if _reviewed_alike(before) != _reviewed_alike(after):
            changed += 1
            print(f"changed {case.name}: {before.summary()} -> {after.summary()}", file=out)
        elif before.rule != after.rule:
            print(f"moved   {case.name}: {before.summary()} -> {after.summary()}", file=out)
        else:
            print(f"same    {case.name}: {after.summary()}", file=out)
    print(f"{len(cases)} cases: {changed} change outcome or reviewers", file=out)
    return 1 if changed else 0


class _Bot:
    """A configuration with its agents' tools, as the bot would load them."""

    def __init__(self, config: Config) -> None:
        self.config = config
        agents, problems = load_agents(config)
        if problems:
            raise ConfigError(problems)
        self.agents = {name: agent.tools for name, agent in agents.items()}
        self.registry = ToolRegistry.merged(self.agents.values())

    def registry_of(self, agent: str | None, tool: str) -> ToolRegistry:
        """The tools the call's arguments are checked with. Raises `ConfigurationError`."""
        if agent is None:
            return self.registry
        tools = self.agents.get(agent)
        if tools is None:
            known = ", ".join(self.agents) or "none"
            raise ConfigurationError(f"no agent named {agent!r} in the file (agents: {known})")
        if tool not in tools:
            names = ", ".join(sorted(t.name for t in tools)) or "none"
            raise ConfigurationError(
                f"the agent {agent!r} has no tool {tool!r} (its tools: {names})"
            )
        return tools

    def check_cases(self, cases: list[LoadedCase], file: str) -> None:
        """Refuse the cases whose agent the file does not have (or that lacks the tool)."""
        found = []
        for index, loaded in enumerate(cases):
            try:
                self.registry_of(loaded.case.agent, loaded.case.tool)
            except ConfigurationError as exc:
                found.append(f"{file}:{loaded.line}: {index}.agent: {exc}")
        if found:
            raise ConfigError(found)

    async def explain(
        self,
        tool: str,
        arguments: dict[str, Any],
        agent: str | None,
        requested_by: str | None,
        schema: dict[str, Any] | None = None,
    ) -> Explanation:
        registry = self.registry_of(agent, tool)
        return await explain(
            self.config,
            tool,
            arguments,
            registry=registry,
            schema=schema,
            requested_by=requested_by,
        )


def _json_object(text: str, option: str) -> dict[str, Any]:
    if len(text) > _MAX_INPUT:
        raise ConfigurationError(f"{option}: longer than {_MAX_INPUT} characters")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        message = f"{option}: not valid JSON: {exc.msg} (column {exc.colno})"
        raise ConfigurationError(message) from None
    except RecursionError:
        raise ConfigurationError(f"{option}: not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"{option}: a JSON object is needed, not {type(value).__name__}")
    return value


def _schema(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(_MAX_INPUT + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"--schema: cannot read {path}: {exc}") from None
    return _json_object(text, f"--schema {path}")


# --- what is printed -------------------------------------------------------------------------


def _reviewed_alike(found: Explanation) -> tuple[str, frozenset[str]]:
    """What `diff` compares: the outcome, and who reviews."""
    reviewers = frozenset(found.review.reviewers) if found.review is not None else frozenset()
    return found.outcome, reviewers


def _differences(case: Case, found: Explanation, config: Config) -> Iterator[str]:
    expect = case.expect
    got = found.summary()
    ruled = "rule" in expect.model_fields_set
    if expect.outcome != found.outcome or (ruled and not _same_rule(expect.rule, found)):
        by = f" by {_rule_text(expect.rule)}" if ruled else ""
        yield f"expected {expect.outcome}{by}, got {got}"
    if expect.reviewers is not None:
        wanted = set()
        for text in expect.reviewers:
            group = config.reviewer_groups.get(text.removeprefix("group:"))
            wanted |= {r.text for r in group} if text.startswith("group:") and group else {text}
        have = set(found.review.reviewers) if found.review is not None else set()
        if wanted != have:
            yield (
                f"expected reviewers {', '.join(sorted(wanted)) or 'none'}, "
                f"got {', '.join(sorted(have)) or 'none'}"
            )


def _same_rule(expected: int | str | None, found: Explanation) -> bool:
    if isinstance(expected, int):
        return found.rule == expected
    if expected is None or expected == "none":
        return found.rule is None
    if expected == "defaults":
        return found.rule == "defaults"
    return found.description == expected


def _rule_text(expected: int | str | None) -> str:
    if isinstance(expected, int):
        return f"rules.{expected}"
    if expected is None or expected == "none":
        return "no rule"
    return "defaults" if expected == "defaults" else f"the rule {expected!r}"


def describe(found: Explanation) -> list[str]:
    """The explanation as the text `nodbot rules explain` prints."""
    lines = [f"{found.tool} {json.dumps(found.arguments, ensure_ascii=False, sort_keys=True)}"]
    if found.judged_by == "as-given":
        checked = "taken as given (a tool that runs elsewhere, no schema)"
    else:
        checked = (
            "checked by the tool's model" if found.judged_by == "model" else "checked by the schema"
        )
    if found.judged is None:
        errors = "; ".join(f"{e['field']}: {e['message']}" for e in found.errors)
        lines.append(f"  arguments: {checked}: they fail it ({errors}); no rule approves them")
    else:
        judged = json.dumps(found.judged, ensure_ascii=False, sort_keys=True)
        lines.append(f"  arguments: {checked}: {judged}")
    for rule in found.passed:
        when = f", when {rule.when}" if rule.when else ""
        lines.append(f"  rules.{rule.rule} ({rule.tool}, {rule.kind}{when}): {rule.why}")
    if isinstance(found.rule, int):
        when = f", when {found.when}" if found.when else ""
        kind = found.outcome
        taken = "its when cannot judge the call: it takes it" if found.fails_closed else "takes it"
        lines.append(f"  rules.{found.rule} ({found.tool}, {kind}{when}): {taken}")
    lines.append(f"outcome: {_outcome(found)}")
    if found.review is not None:
        lines += [f"  {line}" for line in _plan_lines(found.review, found.requested_by)]
    lines += [f"  note: {note}" for note in found.notes]
    return lines


def _outcome(found: Explanation) -> str:
    where = {None: "no rule covers the call", "defaults": "defaults:"}.get(
        found.rule if not isinstance(found.rule, int) else "", f"rules.{found.rule}"
    )
    closed = " (failing closed)" if found.fails_closed else ""
    about = f": {found.description}" if found.description else ""
    if found.outcome == "approve":
        return f"approved at once by {where} (decided_by {found.decided_by}){about}"
    if found.outcome == "deny":
        return f"denied at once by {where}{closed} (decided_by {found.decided_by}): {found.reason}"
    return f"reviewed under {where}{closed}{about}"


def _plan_lines(plan: ReviewPlan, requested_by: str | None) -> Iterator[str]:
    written = ", ".join(plan.reviewers_as_written)
    yield f"reviewers: {', '.join(plan.reviewers)} (as written: {written})"
    not_set = "not configured (the file has no {}:)"
    yield (
        f"slack: {', '.join(plan.slack) or 'nowhere'}"
        if plan.slack is not None
        else ("slack: " + not_set.format("slack"))
    )
    if plan.teams is not None:  # each shown only when the file has it (a newer chat)
        yield f"teams: {', '.join(plan.teams) or 'nowhere'}"
    if plan.discord is not None:
        yield f"discord: {', '.join(plan.discord) or 'nowhere'}"
    yield (
        f"email: {', '.join(plan.email) or 'nobody'}"
        if plan.email is not None
        else ("email: " + not_set.format("email"))
    )
    yield "inbox: in each reviewer's web inbox (/inbox)"
    if plan.webhooks:
        yield f"webhooks told: {', '.join(plan.webhooks)}"
    decisions = f"decisions: {', '.join(plan.allowed_decisions)}"
    if "edit" in plan.allowed_decisions:
        editable = "every argument" if plan.editable is None else ", ".join(plan.editable)
        decisions += f"; editable: {editable}"
        if plan.edit_bounds:
            bounds = ", ".join(json.dumps(bound) for bound in plan.edit_bounds)
            decisions += f"; edit bounds: {bounds}"
    yield decisions
    yield f"approvals required: {plan.approvals_required} (persons; any deny denies)"
    self_approval = "allowed" if plan.allow_self_approval else "not allowed"
    if plan.requester_reviews and not plan.allow_self_approval:
        self_approval += f" ({requested_by} is a reviewer, but may not approve this call)"
    elif plan.requester_reviews is False:
        self_approval += f" ({requested_by} is not a reviewer)"
    yield f"self-approval: {self_approval}"
    if plan.timeout is None:
        yield "timeout: none (the review waits until someone decides)"
    else:
        yield (
            f"timeout: {format_duration(plan.timeout)}, then {plan.timeout_decision} "
            "(decided_by nodbot:timeout)"
        )
    if plan.escalate_after is not None and plan.escalate_to:
        after = format_duration(plan.escalate_after)
        yield f"escalation: after {after}, also {', '.join(plan.escalate_to)}"
    if plan.remember is not None:
        scope = ", ".join(plan.remember_by) if plan.remember_by else "all arguments"
        held = format_duration(plan.remember)
        yield f"remember: an approval may be remembered for {held} (by {scope})"
    if plan.remind_every is not None:
        limit = f", at most {plan.remind_limit}" if plan.remind_limit is not None else ""
        yield f"reminders: every {format_duration(plan.remind_every)}{limit}"
