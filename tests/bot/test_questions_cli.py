"""Questions and respond from the command line (`nodbot approvals answer|decline|decide
--respond|list|show`) against a configuration's SQLite store, with the questions asked by
the test agent `tests.bot.asking_agent` through the bot's rules: exit 0 when decided, 1 when
not (refused, decided already), 2 for a bad input (an answer that is none of the choices, a
question approved, `answer` of a call's review, a malformed command line), nothing recorded
on a bad input; `list` and `show` give a question as a question, with its answer, and every
text a person wrote with its control characters escaped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nodbot.bot.cli import main
from nodbot.bot.config import load_agents, load_config
from nodbot.bot.policy.rules import rules_executor
from nodbot.core import SqlApprovalStore, ToolCall

ROOT = Path(__file__).resolve().parents[2]
LEAD = "U0123LEADS"


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(
        f"""
store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}
agents:
  support: examples.support_agent:agent
  asker: tests.bot.asking_agent:agent
rules:
  - tool: ask
    reviewers: [{LEAD}]
  - tool: refund
    reviewers: [{LEAD}]
    allowed_decisions: [approve, deny, respond]
  - tool: send_email
    reviewers: [{LEAD}]
"""
    )
    return path


async def pause(config_file: Path, agent: str, tool: str, **arguments: object) -> str:
    """The approval id of the review (or question) a call of `tool` opens."""
    config = load_config(config_file)
    agents, _ = load_agents(config)
    async with SqlApprovalStore(config.store.url) as store:
        executor = rules_executor(agents[agent].tools, config, store)
        call = ToolCall(name=tool, arguments=arguments, id=f"c-{tool}")
        result = await executor.run_call(call, executor.context("run_cli", requested_by="carol"))
        assert result.error is not None, result
        return str(result.error.details["approval_id"])


class Cli:
    def __init__(self, config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.config_file = config_file
        self.capsys = capsys

    def __call__(self, *words: str) -> tuple[int, str, str]:
        """`nodbot approvals <words> --config FILE`: the exit status, stdout and stderr."""
        self.capsys.readouterr()
        try:
            status = main(["approvals", *words, "--config", str(self.config_file)])
        except SystemExit as exit:  # argparse's own mistakes
            status = int(exit.code or 0)
        said = self.capsys.readouterr()
        return status, said.out, said.err


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    monkeypatch.chdir(ROOT)
    return Cli(write_config(tmp_path), capsys)


def events_of(cli: Cli, approval_id: str) -> list[str]:
    status, shown, _ = cli("show", approval_id)
    assert status == 0
    return shown.split("events:\n", 1)[1].splitlines() if "events:\n" in shown else []


def test_a_question_is_listed_shown_and_answered(cli: Cli) -> None:
    approval_id = asyncio.run(pause(cli.config_file, "asker", "ship", order_id="A1"))
    status, listed, _ = cli("list")
    assert status == 0
    _, row = listed.splitlines()
    assert row.split()[:5] == [approval_id, "pending", "ask", "run_cli", "-"]
    assert row.endswith("Which warehouse ships order A1?")
    status, shown, _ = cli("show", approval_id)
    assert shown.splitlines()[:5] == [
        f"question {approval_id} (waiting for an answer)",
        "  run run_cli, call c-ship.ask_"
        + shown.split(".ask_")[1].split(",")[0]
        + ", asked for carol, by the tool ship",
        "  asks: Which warehouse ships order A1?",
        "  choices: Leeds, Porto",
        "  no deadline: it waits until someone answers or declines it",
    ]

    # Not one of the choices: a bad input, and nothing is recorded.
    status, out, err = cli("answer", approval_id, "Lisbon", "--as", LEAD)
    assert (status, out) == (2, "")
    assert "answer with one of: Leeds, Porto" in err
    # Not a reviewer of questions: refused (and the refusal recorded), not decided.
    status, _, err = cli("answer", approval_id, "Porto", "--as", "U0999OTHER")
    assert status == 1 and "not one of the reviewers" in err
    # A question is answered or declined, never approved.
    status, _, err = cli("decide", approval_id, "approve", "--as", LEAD)
    assert status == 2 and "not approved" in err
    assert [line.split()[2] for line in events_of(cli, approval_id)] == ["created", "refused"]

    status, out, err = cli("answer", approval_id, "2", "--as", LEAD)  # its number
    assert status == 0, err
    assert out.splitlines()[0] == f"question {approval_id} (answered by {LEAD})"
    assert "  answer: Porto" in out.splitlines()
    status, _, err = cli("answer", approval_id, "Leeds", "--as", LEAD)
    assert status == 1 and "already decided" in err

    status, listed, _ = cli("list")
    row = listed.splitlines()[1]
    assert row.split()[:5] == [approval_id, "answered", "ask", "run_cli", LEAD]
    assert row.endswith("Which warehouse ships order A1?  answer: Porto")
    status, listed, _ = cli("list", "--json")
    [view] = json.loads(listed)
    assert (view["kind"], view["answer"], view["status"]) == ("question", "Porto", "denied")
    assert view["question"]["state"] == "answered"


def test_a_question_is_declined_with_a_reason_and_answers_are_shown_escaped(cli: Cli) -> None:
    shipped = asyncio.run(pause(cli.config_file, "asker", "ship", order_id="A1"))
    status, out, err = cli("decline", shipped, "--as", LEAD, "--reason", "ask the\x1b[2J customer")
    assert status == 0, err
    assert (
        out.splitlines()[0] == f"question {shipped} (declined by {LEAD}: ask the\\x1b[2J customer)"
    )
    assert "\x1b" not in out
    assert cli("list")[1].splitlines()[1].split()[1] == "declined"

    noted = asyncio.run(pause(cli.config_file, "asker", "note", order_id="A2"))
    typed = "Fragile\x1b]0;owned\x07 \u202eglass"
    status, out, err = cli("decide", noted, "--respond", typed, "--as", LEAD)
    assert status == 0, err
    assert "  answer: Fragile\\x1b]0;owned\\x07 \\u202eglass" in out.splitlines()
    for command in (("show", noted), ("list",)):
        shown = cli(*command)[1]
        assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown


def test_decide_respond_answers_in_the_tool_s_place_where_the_rule_allows_it(cli: Cli) -> None:
    refund = asyncio.run(pause(cli.config_file, "support", "refund", order_id="A1", amount=120))
    status, out, err = cli("decide", refund, "--respond", "refunded by hand already", "--as", LEAD)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == f"approval {refund} (responded by {LEAD})"
    assert "  response, in the tool's place: refunded by hand already" in lines
    row = cli("list")[1].splitlines()[1]
    assert row.split()[:2] == [refund, "responded"]
    assert row.endswith("response: refunded by hand already")

    # A rule that does not list respond refuses it: not decided.
    other = asyncio.run(
        pause(cli.config_file, "support", "send_email", to="a@example.com", subject="s", body="b")
    )
    status, _, err = cli("decide", other, "--respond", "done", "--as", LEAD)
    assert status == 1 and "may not be decided with 'respond'" in err
    # `answer` names a question: a call's review is a bad input.
    status, _, err = cli("answer", other, "done", "--as", LEAD)
    assert status == 2 and "not a question" in err


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (("decide", "apr_x", "--as", LEAD), "say the decision"),
        (("decide", "apr_x", "deny", "--respond", "x", "--as", LEAD), "without deny"),
        (("decide", "apr_x", "--respond", "x", "--reason", "y", "--as", LEAD), "--reason"),
        (("decide", "apr_x", "--respond", "  ", "--as", LEAD), "argument --respond"),
        (("decide", "apr_x", "--respond", "x" * 2_001, "--as", LEAD), "at most 2000"),
        (("answer", "apr_x", " ", "--as", LEAD), "an answer is needed"),
        (("answer", "apr_x", "x" * 2_001, "--as", LEAD), "at most 2000"),
        (("answer", "apr_x", "Porto"), "--as"),
        (("decline", "apr_x", "--reason", "x" * 2_001, "--as", LEAD), "--reason"),
    ],
)
def test_a_malformed_command_line_is_a_bad_input(
    cli: Cli, words: tuple[str, ...], said: str
) -> None:
    status, out, err = cli(*words)
    assert (status, out) == (2, "")
    assert said in err
