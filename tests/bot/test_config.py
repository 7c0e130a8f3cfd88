"""The configuration file: loading, validation errors with file, line and key, predicates,
environment variables, agent checks, and `nodbot check-config`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nodbot.bot.config import (
    AllOf,
    AnyOf,
    Config,
    ConfigError,
    Rule,
    check_agents,
    load_agents,
    load_config,
    parse_duration,
    parse_reviewer,
)
from nodbot.core import ConfigurationError, InterruptRule, should_interrupt
from nodbot.core.rules import Comparison, FieldPatterns, Matches
from tests.bot.test_cli import nodbot

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "nodbot.example.yml"

# --- helpers --------------------------------------------------------------------------------


def write(folder: Path, text: str, name: str = "nodbot.yml") -> Path:
    """Write a YAML file (dedented) into `folder` and return its path."""
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def load(folder: Path, text: str) -> Config:
    return load_config(write(folder, text))


def problems_of(folder: Path, text: str) -> list[str]:
    """The problems a file is refused with (fails the test if it loads)."""
    path = write(folder, text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    return refused.value.problems


def only_problem(folder: Path, text: str) -> str:
    found = problems_of(folder, text)
    assert len(found) == 1, found
    return found[0]


def one_rule(rule: str, *, top: str = "") -> str:
    """A file of `top` (its lines first), then `rules:` with `rule` (the lines of a mapping)
    as its only item: with no `top`, the rule's first line is line 2 of the file."""
    first, *rest = textwrap.dedent(rule).strip("\n").splitlines()
    lines = [*textwrap.dedent(top).strip("\n").splitlines(), "rules:", f"  - {first}"]
    lines.extend(f"    {line}" for line in rest)
    return "\n".join(lines) + "\n"


def rule_of(folder: Path, rule: str, *, top: str = "") -> Rule:
    return load(folder, one_rule(rule, top=top)).rules[0]


def rule_problem(folder: Path, rule: str, *, top: str = "") -> str:
    return only_problem(folder, one_rule(rule, top=top))


# --- the example ----------------------------------------------------------------------------


def test_the_example_loads_and_checks_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODBOT_PORT", raising=False)
    config = load_config(EXAMPLE)
    assert config.server.port == 8080
    assert config.agents == {"support": "examples.support_agent:agent"}
    assert [rule.tool for rule in config.rules] == [
        "lookup_order",
        "refund",
        "refund",
        "send_email",
    ]
    assert check_agents(config) == []
    agents, problems = load_agents(config)
    assert problems == []
    assert sorted(tool.name for tool in agents["support"].tools) == [
        "lookup_order",
        "refund",
        "send_email",
    ]


def test_the_example_rules_decide_as_its_comments_say(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODBOT_PORT", raising=False)
    config = load_config(EXAMPLE)
    big = config.first_matching_rule("refund", {"order_id": "A-1", "amount": 120.0})
    small = config.first_matching_rule("refund", {"order_id": "A-1", "amount": 20.0})
    assert big is config.rules[1] and big.timeout == 30 * 60 and big.escalate_after == 15 * 60
    assert small is config.rules[2] and small.decision == "approve"
    outside = {"to": "a@other.org", "subject": "hi", "body": "hello"}
    inside = {"to": "a@example.com", "subject": "hi", "body": "hello"}
    assert config.first_matching_rule("send_email", outside) is config.rules[3]
    assert config.first_matching_rule("send_email", inside) is None
    assert config.first_matching_rule("lookup_order", {"order_id": "A-1"}) is config.rules[0]


def test_the_example_passes_the_cli_check() -> None:
    environment = {name: value for name, value in os.environ.items() if name != "NODBOT_PORT"}
    completed = subprocess.run(
        [nodbot(), "check-config", "nodbot.example.yml"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
    )
    assert completed.stderr == ""
    assert completed.stdout == "nodbot.example.yml: ok (4 rules, 1 agent)\n"
    assert completed.returncode == 0


# --- defaults -------------------------------------------------------------------------------


def test_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, "rules: []\n")
    assert config.store.url == "sqlite:///nodbot.db"
    assert config.store.auto_migrate is True
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8080)
    assert (config.agents, config.reviewer_groups, config.rules) == ({}, {}, [])
    assert (config.slack, config.email) == (None, None)


def test_rule_defaults(tmp_path: Path) -> None:
    rule = rule_of(tmp_path, "tool: refund\nreviewers: [U0123ABCDE]")
    assert rule.when is None and rule.decision is None and rule.description is None
    assert rule.allowed_decisions == ["approve", "edit", "deny"]
    assert rule.editable is None and rule.post_to is None
    assert rule.approvals_required == 1
    assert rule.allow_self_approval is False
    assert rule.timeout is None and rule.timeout_decision == "deny"
    assert rule.escalate_after is None and rule.escalate_to is None


def test_email_is_read_into_its_model(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "web: {secret: a-web-secret-of-16+}\n"
        "email: {from: a@b.c, reply_to: r@b.c, smtp: {host: localhost}}\n",
    )
    assert config.email is not None
    assert (config.email.sender, config.email.smtp.port_or_default) == ("a@b.c", 587)


def test_the_slack_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-0000000000-token")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "signing-secret-000000")
    config = load(
        tmp_path,
        "slack: {bot_token: '${SLACK_BOT_TOKEN}', signing_secret: '${SLACK_SIGNING_SECRET}',"
        " api_url: 'http://127.0.0.1:9/api'}\n",
    )
    assert config.slack is not None
    assert (config.slack.mode, config.slack.api_url) == ("http", "http://127.0.0.1:9/api/")
    assert config.slack.bot_token.get_secret_value() == "xoxb-0000000000-token"
    assert "xoxb" not in repr(config.slack)


@pytest.mark.parametrize(
    ("section", "key", "expected"),
    [
        ("{bot_token: xoxb-0000000000-token}", "slack.signing_secret", "http mode needs"),
        (
            "{mode: socket, bot_token: xoxb-0000000000-token}",
            "slack.app_token",
            "socket mode needs an app-level token",
        ),
        ("{mode: webhook, bot_token: xoxb-0000000000-token}", "slack.mode", "http"),
        ("{bot_token: short, signing_secret: s-0000000000000000}", "slack.bot_token", "16"),
    ],
)
def test_slack_section_errors_name_the_key(
    tmp_path: Path, section: str, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"slack: {section}\n")
    message = str(caught.value)
    assert key in message and expected in message, message


# --- predicates -----------------------------------------------------------------------------

PREDICATES: list[tuple[str, type, dict[str, Any], dict[str, Any]]] = [
    ("{gt: {amount: 100}}", Comparison, {"amount": 100.5}, {"amount": 100}),
    ("{ge: {amount: 100}}", Comparison, {"amount": 100}, {"amount": 99.9}),
    ("{lt: {amount: 100}}", Comparison, {"amount": 99}, {"amount": 100}),
    ("{le: {amount: 100}}", Comparison, {"amount": 100}, {"amount": 101}),
    ("{eq: {currency: EUR}}", Comparison, {"currency": "EUR"}, {"currency": "USD"}),
    ("{eq: {urgent: true}}", Comparison, {"urgent": True}, {"urgent": False}),
    ("{matches: {to: '@ext\\.com$'}}", Matches, {"to": "a@ext.com"}, {"to": "a@ext.com.x"}),
    (
        "{all_fields: {to: '@ext$', cc: '@ext$'}}",
        FieldPatterns,
        {"to": "a@ext", "cc": "b@ext"},
        {"to": "a@ext", "cc": "b@in"},
    ),
    (
        "{any_field: {to: '@ext$', cc: '@ext$'}}",
        FieldPatterns,
        {"to": "a@in", "cc": "b@ext"},
        {"to": "a@in", "cc": "b@in"},
    ),
    (
        "{all: [{gt: {amount: 100}}, {eq: {currency: EUR}}]}",
        AllOf,
        {"amount": 200, "currency": "EUR"},
        {"amount": 200, "currency": "USD"},
    ),
    (
        "{any: [{gt: {amount: 100}}, {eq: {currency: EUR}}]}",
        AnyOf,
        {"amount": 5, "currency": "EUR"},
        {"amount": 5, "currency": "USD"},
    ),
    (
        "{any: [{all: [{ge: {amount: 10}}, {le: {amount: 20}}]}, {matches: {note: urgent}}]}",
        AnyOf,
        {"amount": 30, "note": "very urgent"},
        {"amount": 30, "note": "later"},
    ),
]


@pytest.mark.parametrize(("when", "kind", "matching", "other"), PREDICATES)
def test_each_predicate_maps_to_a_core_predicate_that_behaves(
    tmp_path: Path, when: str, kind: type, matching: dict[str, Any], other: dict[str, Any]
) -> None:
    rule = rule_of(tmp_path, f"tool: pay\nwhen: {when}\nreviewers: [U0123ABCDE]")
    core_rule = rule.to_interrupt_rule()
    assert isinstance(core_rule, InterruptRule) and isinstance(core_rule.match, kind)
    assert should_interrupt([core_rule], "pay", matching) is True
    assert should_interrupt([core_rule], "pay", other) is False
    assert should_interrupt([core_rule], "other_tool", matching) is False


def test_comparison_values_keep_their_yaml_types(tmp_path: Path) -> None:
    rule = rule_of(tmp_path, "tool: pay\nwhen: {gt: {amount: 100}}\ndecision: deny")
    assert rule.to_interrupt_rule().match == Comparison("gt", "amount", 100)


def test_combined_predicates_describe_themselves(tmp_path: Path) -> None:
    when = "{all: [{gt: {amount: 100}}, {any: [{eq: {a: 1}}, {matches: {b: x}}]}]}"
    rule = rule_of(tmp_path, f"tool: pay\nwhen: {when}\ndecision: deny")
    predicate = rule.to_interrupt_rule().match
    assert isinstance(predicate, AllOf)
    assert predicate.describe() == "(amount > 100) and ((a == 1) or (b matches 'x'))"


@pytest.mark.parametrize(
    "when",
    [
        "{gt: {amount: 100}}",
        "{all: [{eq: {currency: USD}}, {gt: {amount: 100}}]}",
        "{any: [{eq: {currency: USD}}, {gt: {amount: 100}}]}",
    ],
)
def test_a_predicate_that_raises_counts_as_a_match(tmp_path: Path, when: str) -> None:
    text = one_rule(f"tool: pay\nwhen: {when}\nreviewers: [U0123ABCDE]")
    config = load(tmp_path, text)
    # `amount` is missing: the predicate cannot decide, so a person is asked.
    assert config.first_matching_rule("pay", {"currency": "EUR"}) is config.rules[0]


def test_first_match_wins(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        rules:
          - tool: refund
            when: {gt: {amount: 1000}}
            decision: deny
          - tool: refund
            when: {gt: {amount: 100}}
            reviewers: [U0123ABCDE]
          - tool: refund
            decision: approve
          - tool: "*"
            when: {eq: {dry_run: false}}
            reviewers: [ops@example.com]
        """,
    )
    first, second, third, fourth = config.rules
    assert config.first_matching_rule("refund", {"amount": 5000}) is first
    assert config.first_matching_rule("refund", {"amount": 500}) is second
    assert config.first_matching_rule("refund", {"amount": 50}) is third
    assert config.first_matching_rule("delete", {"dry_run": False}) is fourth
    assert config.first_matching_rule("delete", {"dry_run": True}) is None


# --- environment variables ------------------------------------------------------------------


def test_variables_are_substituted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODBOT_TEST_HOST", "0.0.0.0")
    monkeypatch.setenv("NODBOT_TEST_PORT", "9001")
    monkeypatch.setenv("NODBOT_TEST_TOKEN", "xoxb-secret")
    config = load(
        tmp_path,
        """
        server:
          host: ${NODBOT_TEST_HOST}
          port: ${NODBOT_TEST_PORT}
        web: {secret: a-web-secret-of-16+}
        email:
          from: a@b.c
          reply_to: r@b.c
          smtp:
            host: localhost
            username: "$${NODBOT_TEST_TOKEN}"
            password: "Bearer ${NODBOT_TEST_TOKEN}"
        """,
    )
    assert (config.server.host, config.server.port) == ("0.0.0.0", 9001)
    assert config.email is not None and config.email.smtp.password is not None
    assert config.email.smtp.password.get_secret_value() == "Bearer xoxb-secret"
    assert config.email.smtp.username == "${NODBOT_TEST_TOKEN}"


def test_a_default_is_used_when_the_variable_is_unset_or_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODBOT_TEST_UNSET", raising=False)
    monkeypatch.setenv("NODBOT_TEST_EMPTY", "")
    monkeypatch.setenv("NODBOT_TEST_SET", "db.sqlite")
    config = load(
        tmp_path,
        """
        server: {port: "${NODBOT_TEST_UNSET:-8181}", host: "${NODBOT_TEST_EMPTY:-::1}"}
        store: {url: "${NODBOT_TEST_SET:-other.db}"}
        """,
    )
    assert (config.server.port, config.server.host) == (8181, "::1")
    assert config.store.url == "db.sqlite"


def test_a_missing_variable_is_an_error_naming_it_and_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODBOT_TEST_MISSING", raising=False)
    monkeypatch.delenv("NODBOT_TEST_ALSO_MISSING", raising=False)
    found = problems_of(
        tmp_path,
        """
        server:
          host: ${NODBOT_TEST_MISSING}
        store:
          url: ${NODBOT_TEST_ALSO_MISSING}
        """,
    )
    assert found == [
        f"{tmp_path / 'nodbot.yml'}:2: server.host: the environment variable "
        "NODBOT_TEST_MISSING is not set; set it, or give a default with "
        "${NODBOT_TEST_MISSING:-default}",
        f"{tmp_path / 'nodbot.yml'}:4: store.url: the environment variable "
        "NODBOT_TEST_ALSO_MISSING is not set; set it, or give a default with "
        "${NODBOT_TEST_ALSO_MISSING:-default}",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("${1BAD}", "bad variable reference '${1BAD}'"), ("${UNCLOSED", "unclosed ${")],
)
def test_a_bad_variable_reference_is_an_error(tmp_path: Path, value: str, expected: str) -> None:
    problem = only_problem(tmp_path, f"store:\n  url: '{value}'\n")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:2: store.url: {expected}")


def test_a_value_from_the_environment_is_never_shown_in_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODBOT_TEST_PORT", "hunter2")
    problem = only_problem(tmp_path, "server:\n  port: ${NODBOT_TEST_PORT}\n")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:2: server.port: ")
    assert "hunter2" not in problem


# --- malformed files ------------------------------------------------------------------------


def test_malformed_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "server:\n  host: [a, b\n  port: 1\n")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:3: malformed YAML: ")
    assert "flow sequence (line 2)" in problem
    assert "quote" not in problem  # nothing to quote there


def test_a_variable_unquoted_inside_braces_is_said_to_need_quotes(tmp_path: Path) -> None:
    # YAML reads the `{` of `${...}` inside `{ }` as another mapping's start.
    text = "api:\n  tokens:\n    - {name: agent, token: ${NODBOT_TOKEN_AGENT}, scopes: []}\n"
    problem = only_problem(tmp_path, text)
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:3: malformed YAML: ")
    assert problem.endswith('; inside { } or [ ], quote a ${...}: write "${NAME}"')


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n- b\n", ":1: (top level): expected a mapping of store, server, workers, agents,"),
        ("just text\n", ":1: (top level): expected a mapping of store, server,"),
        ("# nothing here\n", ":1: (top level): the file is empty; expected a mapping"),
    ],
)
def test_the_top_level_must_be_a_mapping(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in only_problem(tmp_path, text)


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "absent.yml")
    assert refused.value.problems == [
        f"{tmp_path / 'absent.yml'}: cannot read the file: No such file or directory"
    ]


def test_duplicate_keys_are_errors_naming_both_lines(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path,
        """
        server:
          port: 1
          port: 2
        rules:
          - tool: a
            decision: deny
            tool: b
        """,
    )
    file = tmp_path / "nodbot.yml"
    assert found == [
        f"{file}:3: server.port: duplicate key (first given on line 2)",
        f"{file}:7: rules.0.tool: duplicate key (first given on line 5)",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server: !!python/object:os.system x\n", "server: cannot read this value"),
        ("rules: !!set {a, b}\n", "rules: the YAML tag tag:yaml.org,2002:set is not supported"),
        ("web: &loop {self: *loop}\n", "web.self: an alias refers to a value that contains"),
    ],
)
def test_unsafe_tags_and_recursive_aliases_are_refused(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert f":1: {expected}" in only_problem(tmp_path, text)


def test_keys_of_different_types_are_not_duplicates(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "agents:\n  1: m:int\n  '1': m:str\n  yes: m:written\n")
    assert problem.endswith(":2: agents.1: Input should be a valid string, not 1")
    config = load(tmp_path, "agents:\n  '1': m:str\n  yes: m:written\n")
    assert config.agents == {"1": "m:str", "yes": "m:written"}


def test_merge_keys_work_and_keep_lines(tmp_path: Path) -> None:
    text = """
    x-review: &review
      reviewers: [U0123ABCDE]
      timeout: 1h
    rules:
      - tool: a
        <<: *review
      - tool: b
        <<: *review
        timeout: 2h
    """
    problem = only_problem(tmp_path, text)
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:1: x-review: unknown key 'x-review'")
    anchored = """
    rules:
      - &review
        tool: a
        reviewers: [U0123ABCDE]
        timeout: 1h
      - <<: *review
        tool: b
        timeout: 2h
    """
    config = load(tmp_path, anchored)
    assert [(rule.tool, rule.timeout) for rule in config.rules] == [("a", 3600), ("b", 7200)]


# --- unknown keys, wrong types, every problem at once ---------------------------------------


def test_an_unknown_top_level_key_names_the_file_line_and_expected_keys(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "server: {}\nservers:\n  port: 1\n")
    assert problem == (
        f"{tmp_path / 'nodbot.yml'}:2: servers: unknown key 'servers'; did you mean 'server'? "
        "(expected one of: "
        "store, server, workers, agents, framework_agents, external_tools, reviewer_groups, "
        "people, delegations, rules, defaults, slack, teams, discord, email, api, web, webhooks, "
        "audit, log)"
    )


def test_an_unknown_rule_key_names_the_dotted_path(tmp_path: Path) -> None:
    problem = only_problem(
        tmp_path,
        """
        rules:
          - tool: a
            decision: approve
          - tool: b
            description: the second rule
            reviewerz: [U0123ABCDE]
        """,
    )
    assert problem.startswith(
        f"{tmp_path / 'nodbot.yml'}:6: rules.1.reviewerz: unknown key 'reviewerz'; "
        "did you mean 'reviewers'? (expected one of: tool, when, decision, description, "
        "reviewers,"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server:\n  port: http\n", ":2: server.port: Input should be a valid integer"),
        ("server:\n  port: -1\n", ":2: server.port: Input should be greater than or equal to 0"),
        ("server:\n  port: 65536\n", ":2: server.port: Input should be less than or equal"),
        ("store:\n  auto_migrate: maybe\n", ":2: store.auto_migrate: Input should be a valid"),
        ("store:\n  url: mysql://x/y\n", ":2: store.url: expected sqlite:///path.db, postgres"),
        ("rules:\n  tool: a\n", ":1: rules: Input should be a valid list"),
        ("rules:\n  - tool: 12\n    decision: deny\n", ":2: rules.0.tool: Input should be a valid"),
        ("rules:\n  - tool: a b\n    decision: deny\n", ":2: rules.0.tool: expected a tool name"),
        ("rules:\n  - decision: deny\n", ":2: rules.0.tool: the required key 'tool' is missing"),
        ("rules:\n  - tool: a\n    decision: yes\n", ":3: rules.0.decision: Input should be"),
        ("agents:\n  x: mymodule\n", ":2: agents.x: expected an import path such as package"),
        ("agents:\n  a b: m:x\n", ":2: agents.a b: expected a name of letters, digits"),
        ("reviewer_groups:\n  g: []\n", ":2: reviewer_groups.g: expected at least one reviewer"),
        ("slack: [a]\n", ":1: slack: Input should be a valid dictionary"),
    ],
)
def test_wrong_types_name_the_line_and_key(tmp_path: Path, text: str, expected: str) -> None:
    problem = only_problem(tmp_path, text)
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}{expected}"), problem


@pytest.mark.parametrize(
    ("field", "value"),
    [("approvals_required", "true"), ("approvals_required", "0"), ("allowed_decisions", "[]")],
)
def test_wrong_rule_values(tmp_path: Path, field: str, value: str) -> None:
    problem = rule_problem(tmp_path, f"tool: a\nreviewers: [U0123ABCDE]\n{field}: {value}")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:4: rules.0.{field}: ")


def test_every_problem_is_listed_not_just_the_first(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path,
        """
        server:
          port: x
        rules:
          - tool: a
            decision: maybe
          - tool: b
            reviewers: [nobody]
            timeout: soon
        """,
    )
    keys = [problem.split(": ")[1] for problem in found]
    assert keys == ["server.port", "rules.0.decision", "rules.1.reviewers.0", "rules.1.timeout"]
    assert all(problem.startswith(str(tmp_path / "nodbot.yml")) for problem in found)


def test_the_error_is_a_configuration_error_listing_its_problems(tmp_path: Path) -> None:
    path = write(tmp_path, "server: {port: x}\nstore: {url: ''}\n")
    with pytest.raises(ConfigurationError) as refused:
        load_config(path)
    assert isinstance(refused.value, ConfigError)
    assert str(refused.value) == "\n".join(refused.value.problems)
    assert len(refused.value.problems) == 2


# --- durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), (" 5m ", 300)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("value", ["10", "5x", "0s", "1.5h", "-1m", "m", "", "30 s"])
def test_bad_durations_are_refused(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValueError, match="expected a duration such as 30s"):
        parse_duration(value)
    problem = rule_problem(tmp_path, f"tool: a\nreviewers: [U0123ABCDE]\ntimeout: '{value}'")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:4: rules.0.timeout: expected a dur")


def test_a_bare_number_is_not_a_duration(tmp_path: Path) -> None:
    problem = rule_problem(tmp_path, "tool: a\nreviewers: [U0123ABCDE]\ntimeout: 600")
    assert problem.endswith(
        "rules.0.timeout: expected a duration such as 30s, 15m, 2h or 1d, not 600"
    )


# --- predicate errors -----------------------------------------------------------------------


def test_an_unknown_predicate_lists_the_known_ones(tmp_path: Path) -> None:
    problem = rule_problem(tmp_path, "tool: a\nwhen: {above: {amount: 1}}\ndecision: deny")
    assert problem == (
        f"{tmp_path / 'nodbot.yml'}:3: rules.0.when.above: unknown predicate 'above'; "
        "expected one of: gt, ge, lt, le, eq, matches, all_fields, any_field, all, any"
    )


def test_an_unknown_predicate_inside_a_combination_names_its_path(tmp_path: Path) -> None:
    problem = rule_problem(
        tmp_path,
        """
        tool: a
        when:
          all:
            - gt: {amount: 1}
            - bigger: {amount: 2}
        decision: deny
        """,
    )
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:6: rules.0.when.all.1.bigger: unknown")


@pytest.mark.parametrize(
    ("when", "path", "expected"),
    [
        ("{gt: {a: 1}, lt: {a: 5}}", "when", "a predicate has exactly one key, found gt, lt"),
        ("{}", "when", "an empty predicate; expected one of: gt"),
        ("amount > 100", "when", "expected a predicate mapping such as {gt: {amount: 100}}"),
        ("{gt: {a: 1, b: 2}}", "when.gt", "expected exactly one {argument: value}, found a, b"),
        ("{gt: null}", "when.gt", "expected a value, not null"),
        ("{gt: {a: true}}", "when.gt.a", "expected a number or a string to compare with, not T"),
        ("{lt: {a: [1]}}", "when.lt.a", "expected a number or a string to compare with, not a "),
        ("{eq: {a: {b: 1}}}", "when.eq.a", "expected a number, a string, a boolean or null"),
        (
            "{ge: {day: 2024-01-01}}",
            "when.ge.day",
            "expected a number or a string to compare with, not datetime.date",
        ),
        ("{matches: {to: '('}}", "when.matches.to", "not a valid regular expression"),
        ("{matches: {a: x, b: y}}", "when.matches", "expected exactly one {argument: value}"),
        ("{all_fields: {}}", "when.all_fields", "expected at least one {argument: regex}"),
        ("{any_field: {a: '[z-a]'}}", "when.any_field.a", "not a valid regular expression"),
        ("{matches: {to: 5}}", "when.matches.to", "Input should be a valid string"),
        ("{any: []}", "when.any", "expected a list of at least one predicate"),
        ("{gt: {a: .nan}}", "when.gt.a", "expected a number, not NaN"),
        ("{gt: {'': 1}}", "when.gt", "gt() needs an argument name, not ''"),
        ("{all: {gt: {a: 1}}}", "when.all", "Input should be a valid list"),
    ],
)
def test_malformed_predicates_name_the_path(
    tmp_path: Path, when: str, path: str, expected: str
) -> None:
    problem = rule_problem(tmp_path, f"tool: a\nwhen: {when}\ndecision: deny")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:3: rules.0.{path}: {expected}"), problem


# --- rule consistency -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "line", "key", "expected"),
    [
        (
            "tool: a\ndecision: approve\nreviewers: [U0123ABCDE]",
            4,
            "rules.0.reviewers",
            "not allowed with decision: approve (a rule either decides by itself or names",
        ),
        ("tool: a\ndecision: deny\ntimeout: 1h", 4, "rules.0.timeout", "not allowed with deci"),
        (
            "tool: a\ndescription: no decider",
            2,
            "rules.0",
            "a rule needs reviewers (who decides) or decision: approve | deny",
        ),
        ("tool: a\nreviewers: []", 3, "rules.0.reviewers", "expected at least one reviewer"),
        (
            "tool: a\nreviewers: [U0123ABCDE]\nescalate_after: 5m",
            4,
            "rules.0.escalate_after",
            "needs escalate_to too (give both or neither)",
        ),
        (
            "tool: a\nreviewers: [U0123ABCDE]\nescalate_to: [U0456FGHIJ]",
            4,
            "rules.0.escalate_to",
            "needs escalate_after too (give both or neither)",
        ),
        (
            "tool: a\nreviewers: [U0]\ntimeout: 1h\nescalate_after: 1h\nescalate_to: [U0456FGHIJ]",
            3,
            "rules.0.reviewers.0",
            "expected a Slack user id",
        ),
        (
            "tool: a\nreviewers: [U0123ABCDE]\ntimeout: 1h\nescalate_after: 2h\n"
            "escalate_to: [U0456FGHIJ]",
            5,
            "rules.0.escalate_after",
            "must be shorter than timeout",
        ),
        (
            "tool: a\nreviewers: [U0123ABCDE]\ntimeout_decision: approve",
            4,
            "rules.0.timeout_decision",
            "has no effect without timeout",
        ),
        (
            "tool: a\nreviewers: [U0123ABCDE]\nallowed_decisions: [approve, deny]\neditable: [x]",
            5,
            "rules.0.editable",
            "has no effect unless allowed_decisions includes edit",
        ),
        (
            "tool: a\nreviewers: [U0123ABCDE]\neditable: []",
            4,
            "rules.0.editable",
            "an empty list allows no edit",
        ),
        (
            "tool: a\nreviewers: [U0123ABCDE]\nallowed_decisions: [edit, edit]",
            4,
            "rules.0.allowed_decisions",
            "each decision may be listed once",
        ),
        (
            "tool: a\nreviewers: [U0123ABCDE]\nallowed_decisions: [approve, ok]",
            4,
            "rules.0.allowed_decisions.1",
            "Input should be 'approve', 'edit', 'deny' or 'respond'",
        ),
    ],
)
def test_inconsistent_rules_are_refused(
    tmp_path: Path, rule: str, line: int, key: str, expected: str
) -> None:
    problem = rule_problem(tmp_path, rule)
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:{line}: {key}: {expected}"), problem


@pytest.mark.parametrize(
    ("reviewers", "required", "refused"),
    [
        ("[U0123ABCDE, a@example.com]", 2, False),
        ("[U0123ABCDE, a@example.com]", 3, True),
        ("[U0123ABCDE, U0123ABCDE, A@example.com, a@EXAMPLE.com]", 3, True),
        ("['#approvers', U0123ABCDE]", 5, False),  # a channel's size is unknown
        ("[S0123ABCDE]", 5, False),  # so is a user group's
    ],
)
def test_approvals_required_cannot_exceed_the_listed_individuals(
    tmp_path: Path, reviewers: str, required: int, refused: bool
) -> None:
    rule = f"tool: a\nreviewers: {reviewers}\napprovals_required: {required}"
    if not refused:
        assert rule_of(tmp_path, rule).approvals_required == required
        return
    problem = rule_problem(tmp_path, rule)
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:4: rules.0.approvals_required: ")
    assert f"{required} approvals cannot come from 2 listed reviewer(s)" in problem


def test_approvals_required_counts_the_members_of_named_groups(tmp_path: Path) -> None:
    top = "reviewer_groups:\n  leads: [U0123ABCDE, lead@example.com]"
    rule = "tool: a\nreviewers: [group:leads, U0123ABCDE]\napprovals_required: {}"
    assert rule_of(tmp_path, rule.format(2), top=top).approvals_required == 2
    problem = rule_problem(tmp_path, rule.format(3), top=top)
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:6: rules.0.approvals_required: 3 ")


# --- reviewers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "value", "individual"),
    [
        ("U0123ABCDE", "slack_user", "U0123ABCDE", True),
        ("W0123ABCDE", "slack_user", "W0123ABCDE", True),
        ("S0123ABCDE", "slack_user_group", "S0123ABCDE", False),
        ("#support-approvals", "slack_channel", "#support-approvals", False),
        ("C0123ABCDE", "slack_channel", "C0123ABCDE", False),
        ("Ana@Example.com", "email", "ana@example.com", True),
        ("a@b", "email", "a@b", True),
        ("group:support-leads", "group", "support-leads", False),
    ],
)
def test_reviewer_kinds(text: str, kind: str, value: str, individual: bool) -> None:
    reviewer = parse_reviewer(text)
    assert (reviewer.kind, reviewer.value, reviewer.text) == (kind, value, text)
    assert reviewer.is_individual is individual


@pytest.mark.parametrize(
    "text", ["bob", "u0123abcde", "U01", "#Bad Channel", "group:", "D0123ABCDE", "a@b@c", 42, None]
)
def test_a_bad_reviewer_is_refused_saying_what_is_accepted(text: object) -> None:
    with pytest.raises(ValueError, match=r"expected a Slack user id \(U\.\.\. or W\.\.\.\)"):
        parse_reviewer(text)


def test_a_bad_reviewer_in_the_file_names_its_item(tmp_path: Path) -> None:
    problem = rule_problem(tmp_path, "tool: a\nreviewers:\n  - U0123ABCDE\n  - bob")
    assert problem == (
        f"{tmp_path / 'nodbot.yml'}:5: rules.0.reviewers.1: expected a Slack user id (U... or "
        "W...), a user group id (S...), a channel (#name or C...), an email address "
        "(name@example.com) or group:<name> naming a reviewer group, not 'bob'"
    )


def test_every_reviewer_kind_loads_from_the_file(tmp_path: Path) -> None:
    reviewers = "[U0123ABCDE, S0123ABCDE, '#ops', C0123ABCDE, a@b.c, group:leads]"
    rule = rule_of(
        tmp_path,
        f"tool: a\nreviewers: {reviewers}\npost_to: ['#ops', C0123ABCDE, dm]",
        top="reviewer_groups:\n  leads: [W0123ABCDE]",
    )
    assert [reviewer.kind for reviewer in rule.reviewers or []] == [
        "slack_user",
        "slack_user_group",
        "slack_channel",
        "slack_channel",
        "email",
        "group",
    ]
    assert rule.post_to == ["#ops", "C0123ABCDE", "dm"]


def test_post_to_takes_only_channels_and_dm(tmp_path: Path) -> None:
    problem = rule_problem(tmp_path, "tool: a\nreviewers: [U0123ABCDE]\npost_to: [U0123ABCDE]")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:4: rules.0.post_to.0: expected a Slack")


def test_an_unknown_reviewer_group_is_an_error(tmp_path: Path) -> None:
    problem = rule_problem(
        tmp_path,
        "tool: a\nreviewers: [U0123ABCDE]\nescalate_after: 5m\nescalate_to: [group:leeds]",
        top="reviewer_groups:\n  leads: [W0123ABCDE]",
    )
    assert problem == (
        f"{tmp_path / 'nodbot.yml'}:7: rules.0.escalate_to.0: no reviewer group named "
        "'leeds'; defined: leads"
    )


def test_a_group_cannot_name_another_group(tmp_path: Path) -> None:
    problem = only_problem(tmp_path, "reviewer_groups:\n  a: [U0123ABCDE]\n  b: [a@b.c, group:a]\n")
    assert problem == (
        f"{tmp_path / 'nodbot.yml'}:3: reviewer_groups.b.1: a reviewer group cannot name "
        "another group"
    )


def test_a_rule_hidden_by_an_earlier_one_is_an_error(tmp_path: Path) -> None:
    found = problems_of(
        tmp_path,
        """
        rules:
          - tool: refund
            reviewers: [U0123ABCDE]
          - tool: refund
            when: {gt: {amount: 100}}
            decision: deny
          - tool: "*"
            decision: deny
          - tool: email
            decision: approve
        """,
    )
    file = tmp_path / "nodbot.yml"
    assert found == [
        f"{file}:4: rules.1: this rule is never used: rules.0 (without when) matches every "
        "call of 'refund' first",
        f"{file}:9: rules.3: this rule is never used: rules.2 (without when) matches every "
        "call first",
    ]


# --- defaults: and edit_bounds --------------------------------------------------------------


def test_defaults_section_loads_as_a_review_policy(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
        reviewer_groups:
          leads: [U0123ABCDE, lead@example.com]
        defaults:
          description: Tools that ask for review and no rule covers.
          reviewers: [group:leads]
          timeout: 1h
          timeout_decision: deny
          allowed_decisions: [approve, edit, deny]
          editable: [amount]
          edit_bounds: [{gt: {amount: 0}}]
          approvals_required: 2
          escalate_after: 30m
          escalate_to: [ops@example.com]
        """,
    )
    defaults = config.defaults
    assert defaults is not None
    assert [reviewer.text for reviewer in config.expand(defaults.reviewers or [])] == [
        "U0123ABCDE",
        "lead@example.com",
    ]
    assert (defaults.timeout, defaults.escalate_after, defaults.approvals_required) == (
        3600,
        1800,
        2,
    )
    assert [bound.to_json() for bound in defaults.edit_bounds or []] == [{"gt": {"amount": 0}}]
    assert load(tmp_path, "rules: []\n").defaults is None


@pytest.mark.parametrize(
    ("defaults", "line", "key", "expected"),
    [
        ("  timeout: 1h", 1, "defaults", "defaults need reviewers: who decides the calls no"),
        ("  reviewers: [U0123ABCDE]\n  tool: refund", 3, "defaults.tool", "unknown key 'tool'"),
        ("  reviewers: [U0123ABCDE]\n  decision: deny", 3, "defaults.decision", "unknown key"),
        ("  reviewers: [U0123ABCDE]\n  when: {gt: {a: 1}}", 3, "defaults.when", "unknown key"),
        ("  reviewers: []", 2, "defaults.reviewers", "expected at least one reviewer"),
        ("  reviewers: [group:nope]", 2, "defaults.reviewers.0", "no reviewer group named 'nope'"),
        (
            "  reviewers: [U0123ABCDE]\n  timeout: 1h\n  escalate_after: 2h\n"
            "  escalate_to: [U0456FGHIJ]",
            4,
            "defaults.escalate_after",
            "must be shorter than timeout",
        ),
        (
            "  reviewers: [U0123ABCDE]\n  approvals_required: 2",
            3,
            "defaults.approvals_required",
            "2 approvals cannot come from 1 listed reviewer(s)",
        ),
        (
            "  reviewers: [U0123ABCDE]\n  allowed_decisions: [approve]\n"
            "  edit_bounds: [{gt: {a: 0}}]",
            4,
            "defaults.edit_bounds",
            "has no effect unless allowed_decisions includes edit",
        ),
    ],
)
def test_defaults_are_validated_like_a_rule(
    tmp_path: Path, defaults: str, line: int, key: str, expected: str
) -> None:
    problem = only_problem(tmp_path, f"defaults:\n{defaults}\n")
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:{line}: {key}: {expected}"), problem


def test_defaults_after_a_rule_for_every_call_are_never_used(tmp_path: Path) -> None:
    problem = only_problem(
        tmp_path,
        'rules:\n  - tool: "*"\n    decision: deny\ndefaults:\n  reviewers: [U0123ABCDE]\n',
    )
    assert problem == (
        f"{tmp_path / 'nodbot.yml'}:4: defaults: never used: rules.0 (tool '*', without when) "
        "matches every call first"
    )


def test_edit_bounds_load_with_references_to_the_original(tmp_path: Path) -> None:
    rule = rule_of(
        tmp_path,
        """
        tool: refund
        reviewers: [U0123ABCDE]
        edit_bounds:
          - {gt: {amount: 0}}
          - {le: {amount: {original: amount}}}
          - any: [{eq: {currency: {original: currency}}}, {matches: {currency: '^EUR$'}}]
        """,
    )
    bounds = rule.edit_bounds or []
    assert [bound.to_json() for bound in bounds] == [
        {"gt": {"amount": 0}},
        {"le": {"amount": {"original": "amount"}}},
        {
            "any": [
                {"eq": {"currency": {"original": "currency"}}},
                {"matches": {"currency": "^EUR$"}},
            ]
        },
    ]
    assert [sorted(bound.references()) for bound in bounds] == [[], ["amount"], ["currency"]]
    assert sorted(bounds[2].argument_names()) == ["currency"]


@pytest.mark.parametrize(
    ("bounds", "key", "expected"),
    [
        ("[]", "edit_bounds", "expected at least one bound, such as {gt: {amount: 0}}"),
        ("{gt: {amount: 0}}", "edit_bounds", "Input should be a valid list"),
        ("[{gt: {amount: 0}, lt: {amount: 9}}]", "edit_bounds.0", "a predicate has exactly one"),
        ("[{below: {amount: 0}}]", "edit_bounds.0.below", "unknown predicate 'below'"),
        (
            "[{le: {amount: {original: amount, or: 1}}}]",
            "edit_bounds.0.le.amount",
            "expected {original: <argument>} naming an argument of the original call, or a "
            "number or a string; found the keys original, or",
        ),
        (
            "[{le: {amount: {original: 5}}}]",
            "edit_bounds.0.le.amount.original",
            "expected an argument name, not 5",
        ),
        (
            "[{le: {amount: original.amount}}]",
            "edit_bounds.0.le.amount",
            "'original.amount' would be compared as a string; to compare with the original "
            "call's amount, write {original: amount}",
        ),
        ("[{le: {amount: [1]}}]", "edit_bounds.0.le.amount", "expected a number or a string"),
        ("[{gt: {amount: true}}]", "edit_bounds.0.gt.amount", "expected a number or a string"),
        ("[{all: [{matches: {to: '('}}]}]", "edit_bounds.0.all.0.matches.to", "not a valid"),
    ],
)
def test_malformed_edit_bounds_name_the_path(
    tmp_path: Path, bounds: str, key: str, expected: str
) -> None:
    problem = rule_problem(
        tmp_path, f"tool: refund\nreviewers: [U0123ABCDE]\nedit_bounds: {bounds}"
    )
    assert problem.startswith(f"{tmp_path / 'nodbot.yml'}:4: rules.0.{key}: {expected}"), problem


def test_edit_bounds_need_a_review_that_allows_edits(tmp_path: Path) -> None:
    decided = rule_problem(tmp_path, "tool: a\ndecision: approve\nedit_bounds: [{gt: {x: 0}}]")
    assert "rules.0.edit_bounds: not allowed with decision: approve" in decided
    no_edit = rule_problem(
        tmp_path,
        "tool: a\nreviewers: [U0123ABCDE]\nallowed_decisions: [approve, deny]\n"
        "edit_bounds: [{gt: {x: 0}}]",
    )
    assert "rules.0.edit_bounds: has no effect unless allowed_decisions includes edit" in no_edit


# --- agents ---------------------------------------------------------------------------------

AGENTS_MODULE = """
from nodbot.core import Agent, ScriptedChat, ToolRegistry

tools = ToolRegistry()


@tools.tool
def refund(order_id: str, amount: float) -> str:
    return "ok"


@tools.tool
def export(json: str, _format: str = "csv") -> str:
    return "ok"


agent = Agent(ScriptedChat(["done"]), tools)
other = Agent(ScriptedChat(["done"]), ToolRegistry())
text = "not an agent"


def make_agent() -> Agent:
    return agent


def make_text() -> str:
    return text


def needs_arguments(name: str) -> Agent:
    return agent


async def make_async() -> Agent:
    return agent


def explodes() -> Agent:
    raise RuntimeError("no model configured")
"""


@pytest.fixture
def agents_module(tmp_path: Path) -> Iterator[str]:
    """A module of agents beside the configuration file, under a name unique to the test."""
    name = "agents_" + re.sub(r"\W", "_", tmp_path.name)
    (tmp_path / f"{name}.py").write_text(AGENTS_MODULE, encoding="utf-8")
    yield name
    sys.modules.pop(name, None)


def check(folder: Path, text: str) -> list[str]:
    return check_agents(load(folder, text))


def test_agents_and_factories_load(tmp_path: Path, agents_module: str) -> None:
    config = load(
        tmp_path, f"agents:\n  a: {agents_module}:agent\n  b: {agents_module}:make_agent\n"
    )
    agents, problems = load_agents(config)
    assert problems == []
    assert agents["a"] is agents["b"]
    assert "refund" in agents["a"].tools


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            "no_such_module_here:agent",
            "cannot import 'no_such_module_here': No module named 'no_such_module_here'",
        ),
        ("{m}:missing", "'{m}' has no attribute 'missing'"),
        (
            "{m}:text",
            "{m}:text is a str, not a core.Agent or a zero-argument callable returning one",
        ),
        ("{m}:make_text", "{m}:make_text() returned a str, not a core.Agent"),
        (
            "{m}:needs_arguments",
            "{m}:needs_arguments takes arguments (name); expected a core.Agent or a "
            "zero-argument callable returning one",
        ),
        (
            "{m}:make_async",
            "{m}:make_async is async; expected a plain callable returning a core.Agent",
        ),
        ("{m}:explodes", "calling {m}:explodes() raised RuntimeError: no model configured"),
    ],
)
def test_a_bad_agent_is_a_problem_naming_its_entry(
    tmp_path: Path, agents_module: str, target: str, expected: str
) -> None:
    target, expected = target.format(m=agents_module), expected.format(m=agents_module)
    text = f"server: {{}}\nagents:\n  good: {agents_module}:agent\n  bad: {target}\n"
    assert check(tmp_path, text) == [f"{tmp_path / 'nodbot.yml'}:4: agents.bad: {expected}"]


def test_a_module_that_fails_to_import_is_a_problem(tmp_path: Path) -> None:
    (tmp_path / "broken_agents_module.py").write_text("raise RuntimeError('boom')\n")
    try:
        found = check(tmp_path, "agents:\n  x: broken_agents_module:agent\n")
    finally:
        sys.modules.pop("broken_agents_module", None)
    assert found == [
        f"{tmp_path / 'nodbot.yml'}:2: agents.x: importing 'broken_agents_module' raised "
        "RuntimeError: boom"
    ]


def test_a_rule_naming_an_unknown_tool_is_a_problem(tmp_path: Path, agents_module: str) -> None:
    found = check(
        tmp_path,
        f"""
        agents:
          a: {agents_module}:agent
        rules:
          - tool: refund
            decision: approve
          - tool: refnud
            decision: deny
          - tool: "*"
            decision: deny
        """,
    )
    assert found == [
        f"{tmp_path / 'nodbot.yml'}:6: rules.1.tool: no agent registers a tool named 'refnud'; "
        "registered tools: export, refund"
    ]


def test_editable_must_name_arguments_of_the_tool(tmp_path: Path, agents_module: str) -> None:
    found = check(
        tmp_path,
        f"""
        agents:
          a: {agents_module}:agent
          empty: {agents_module}:other
        rules:
          - tool: refund
            reviewers: [U0123ABCDE]
            editable: [amount, amout]
          - tool: export
            reviewers: [U0123ABCDE]
            editable: [json, _format]
        """,
    )
    assert found == [
        f"{tmp_path / 'nodbot.yml'}:7: rules.0.editable.1: 'amout' is not an argument: "
        "tool 'refund' (agent 'a') takes order_id, amount"
    ]


def test_when_must_name_arguments_of_the_tool(tmp_path: Path, agents_module: str) -> None:
    found = check(
        tmp_path,
        f"""
        agents:
          a: {agents_module}:agent
        rules:
          - tool: refund
            when: {{any: [{{gt: {{amout: 1}}}}, {{eq: {{order_id: x}}}}]}}
            reviewers: [U0123ABCDE]
        """,
    )
    assert found == [
        f"{tmp_path / 'nodbot.yml'}:5: rules.0.when: 'amout' is not an argument: "
        "tool 'refund' (agent 'a') takes order_id, amount"
    ]


def test_edit_bounds_must_name_arguments_of_the_tool(tmp_path: Path, agents_module: str) -> None:
    found = check(
        tmp_path,
        f"""
        agents:
          a: {agents_module}:agent
        rules:
          - tool: refund
            reviewers: [U0123ABCDE]
            edit_bounds:
              - {{gt: {{amout: 0}}}}
              - {{le: {{amount: {{original: total}}}}}}
              - {{le: {{amount: {{original: amount}}}}}}
        """,
    )
    takes = "tool 'refund' (agent 'a') takes order_id, amount"
    assert found == [
        f"{tmp_path / 'nodbot.yml'}:7: rules.0.edit_bounds.0: 'amout' is not an argument: {takes}",
        f"{tmp_path / 'nodbot.yml'}:8: rules.0.edit_bounds.1: 'total' is not an argument: {takes}",
    ]


def test_edit_bounds_that_no_edit_could_meet_are_problems(
    tmp_path: Path, agents_module: str
) -> None:
    found = check(
        tmp_path,
        f"""
        agents:
          a: {agents_module}:agent
        rules:
          - tool: refund
            reviewers: [U0123ABCDE]
            edit_bounds:
              - {{gt: {{amount: "0"}}}}
              - {{le: {{amount: {{original: order_id}}}}}}
              - {{all: [{{matches: {{amount: '^1'}}}}]}}
              - {{le: {{amount: 100}}}}
              - {{eq: {{order_id: {{original: order_id}}}}}}
        """,
    )
    file = tmp_path / "nodbot.yml"
    assert found == [
        f"{file}:7: rules.0.edit_bounds.0: gt: amount (number) cannot be compared with '0' "
        "(string): every edit would be refused",
        f"{file}:8: rules.0.edit_bounds.1: le: amount (number) cannot be compared with the "
        "original order_id (string): every edit would be refused",
        f"{file}:9: rules.0.edit_bounds.2: matches: amount is number, not a string: every edit "
        "would be refused",
    ]


def test_rules_are_not_checked_when_an_agent_failed(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        "agents:\n  a: no_such_module_here:agent\nrules:\n  - tool: x\n    decision: deny\n",
    )
    assert len(found) == 1 and "agents.a: cannot import" in found[0]


def test_loading_imports_no_agent(tmp_path: Path) -> None:
    config = load(tmp_path, "agents:\n  a: no_such_module_here:agent\n")
    assert config.agents == {"a": "no_such_module_here:agent"}
    assert "no_such_module_here" not in sys.modules


# --- nodbot check-config --------------------------------------------------------------------


def run_check(file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nodbot(), "check-config", str(file)], capture_output=True, text=True, cwd=file.parent
    )


def test_check_config_reports_ok(tmp_path: Path, agents_module: str) -> None:
    path = write(
        tmp_path,
        f"""
        agents:
          a: {agents_module}:agent
        rules:
          - tool: refund
            decision: approve
          - tool: export
            reviewers: [ops@example.com]
        """,
    )
    completed = run_check(path)
    assert (completed.returncode, completed.stderr) == (0, "")
    assert completed.stdout == f"{path}: ok (2 rules, 1 agent)\n"


def test_check_config_prints_every_problem_and_fails(tmp_path: Path) -> None:
    path = write(tmp_path, "server:\n  port: x\nrules:\n  - tool: a\n    reviewerz: []\n")
    completed = run_check(path)
    assert completed.returncode == 2  # a bad input
    assert completed.stdout == ""
    assert completed.stderr.splitlines() == [
        f"{path}:2: server.port: Input should be a valid integer, unable to parse string as an "
        "integer, not 'x'",
        f"{path}:5: rules.0.reviewerz: unknown key 'reviewerz'; did you mean 'reviewers'? "
        "(expected one of: tool, when, decision, description, reviewers, post_to, "
        "allowed_decisions, editable, edit_bounds, approvals_required, allow_self_approval, "
        "timeout, timeout_decision, escalate_after, escalate_to, remind_every, remind_limit, "
        "remember, remember_by)",
    ]


def test_check_config_fails_on_an_agent_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "agents:\n  a: no_such_module_here:agent\n")
    completed = run_check(path)
    assert completed.returncode == 2  # the file names a module that is not there
    assert completed.stderr.startswith(f"{path}:2: agents.a: cannot import 'no_such_module_here'")


def test_a_postgres_database_url_as_hosts_give_it_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://nodbot@db.internal:5432/nodbot")
    config = load(tmp_path, 'store: {url: "${DATABASE_URL}"}\n')
    assert config.store.url == "postgres://nodbot@db.internal:5432/nodbot"
