"""Who is asked a question (`ctx.ask`): the configuration's rules, through the bot's port.

A question goes to the people of the first review rule that covers the pseudo-tool `ask`
(`tool: ask` or `*`, its `when` judging the question's `asked_by`), else `defaults:`; rules
that decide at once are passed over (a question needs a person), and with nobody to ask it
is declined at once, with a reason that says what to add. Under its rule a question is
answered or declined (never approved or edited), by one person, and a timeout declines it
whatever the rule's `timeout_decision`. The rule's reviewers may answer it, others may not.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nodbot.bot.cli import main as nodbot_command
from nodbot.bot.config import load_config
from nodbot.bot.policy.authorize import authorizer_for
from nodbot.bot.policy.rules import rule_refusal, rules_executor
from nodbot.core import (
    QUESTION_TOOL,
    ApprovalRecord,
    Decision,
    MemoryApprovalStore,
    QuestionPending,
    QuestionUnanswered,
    ToolCall,
)
from nodbot.core.questions import make_question, question_request
from tests.bot.asking_agent import tools

ASKER = "bo@example.com"


def executor_for(tmp_path: Path, rules: str, store: MemoryApprovalStore):
    path = tmp_path / "nodbot.yml"
    path.write_text(f'store: {{url: "sqlite:///{tmp_path}/n.db"}}\n{rules}')
    config = load_config(path)
    return config, rules_executor(tools, config, store)


async def asked(executor, name: str = "ship") -> str:
    """The approval id of the question the tool `name` asks in a new run."""
    call = ToolCall(name=name, arguments={"order_id": "A1"}, id="call_1")
    result = await executor.run_call(call, executor.context("run_1", requested_by=ASKER))
    assert result.status == "pending" and result.error is not None, result
    assert result.error.kind == "question-pending"
    return result.error.details["approval_id"]


ROUTED = """
rules:
  - tool: "*"
    decision: approve
    description: everything runs
  - tool: ask
    when: {eq: {asked_by: note}}
    reviewers: [writer@example.com]
  - tool: ask
    reviewers: [ops@example.com, U0OPS00001]
    approvals_required: 2
    timeout: 1h
    timeout_decision: approve
"""


async def test_a_question_goes_to_the_first_review_rule_of_ask_past_rules_that_decide(
    tmp_path: Path,
) -> None:
    store = MemoryApprovalStore()
    _, executor = executor_for(tmp_path, ROUTED, store)

    ship = await store.get(await asked(executor, "ship"))
    note = await store.get(await asked(executor, "note"))

    assert ship.request.tool == QUESTION_TOOL
    assert ship.request.policy["rule"] == 2
    assert ship.request.policy["reviewers"] == ["ops@example.com", "U0OPS00001"]
    assert note.request.policy["rule"] == 1
    assert note.request.policy["reviewers"] == ["writer@example.com"]
    # A question: answered or declined, once, by one person; a timeout declines it.
    assert ship.request.policy["allowed_decisions"] == ["respond", "deny"]
    assert ship.request.policy["editable"] == []
    assert ship.request.approvals_required == 1
    assert ship.request.on_timeout == "deny"
    assert ship.request.deadline is not None


async def test_a_question_no_rule_covers_goes_to_the_defaults(tmp_path: Path) -> None:
    store = MemoryApprovalStore()
    rules = (
        "defaults:\n  reviewers: [lead@example.com]\n"
        "rules:\n  - tool: refund\n    reviewers: [x@example.com]\n"
    )
    _, executor = executor_for(tmp_path, rules, store)

    record = await store.get(await asked(executor))

    assert record.request.policy["rule"] == "defaults"
    assert record.request.policy["reviewers"] == ["lead@example.com"]


@pytest.mark.parametrize(
    "rules",
    [
        "rules:\n  - tool: refund\n    reviewers: [x@example.com]\n",
        'rules:\n  - tool: "*"\n    decision: approve\n',
        "rules:\n  - tool: ask\n    decision: deny\n",
    ],
    ids=["no-rule-for-ask", "only-an-approve-rule", "only-a-deny-rule"],
)
async def test_with_nobody_to_ask_the_question_is_declined_saying_what_to_add(
    tmp_path: Path, rules: str
) -> None:
    store = MemoryApprovalStore()
    _, executor = executor_for(tmp_path, rules, store)

    with pytest.raises(QuestionUnanswered) as unanswered:
        await executor.context("run_1").ask("Which one?", choices=["a", "b"])

    assert "tool: ask" in str(unanswered.value.reason)
    assert unanswered.value.decided_by == "nodbot:no-rule"
    assert await store.list() == []  # nothing waits for anyone


async def test_the_rules_reviewers_may_answer_others_may_not_and_nobody_approves(
    tmp_path: Path,
) -> None:
    store = MemoryApprovalStore()
    config, executor = executor_for(tmp_path, ROUTED, store)
    record = await store.get(await asked(executor))
    authorize = authorizer_for(config)
    answer = Decision(approved=False, response="Porto", decided_by="ops@example.com")

    allowed = await authorize("ops@example.com", record, answer)
    stranger = await authorize("eve@example.com", record, answer)
    approve = await authorize("ops@example.com", record, Decision(approved=True))
    edit = await authorize(
        "ops@example.com", record, Decision(approved=True, edited_args={"question": "x"})
    )
    decline = await authorize("ops@example.com", record, Decision(approved=False, reason="no"))

    assert allowed.refusal is None
    assert stranger.refusal is not None and "not one of the reviewers" in stranger.refusal
    assert approve.refusal is not None and "not decided with 'approve'" in approve.refusal
    assert edit.refusal is not None
    assert decline.refusal is None


async def test_an_answered_question_resumes_the_bots_executor(tmp_path: Path) -> None:
    store = MemoryApprovalStore()
    _, executor = executor_for(tmp_path, ROUTED, store)
    approval_id = await asked(executor)
    await executor.decide(
        approval_id, {"action": "respond", "message": "1"}, decided_by="ops@example.com"
    )

    call = ToolCall(name="ship", arguments={"order_id": "A1"}, id="call_1")
    result = await executor.run_call(call, executor.context("run_1", requested_by=ASKER))

    assert (result.status, result.value) == ("ok", "A1 ships from Leeds")
    # Asked again in another call: a new question, pending.
    with pytest.raises(QuestionPending):
        await executor.context("run_2").ask(
            "Which warehouse ships order A1?", choices=["Leeds", "Porto"]
        )


CHECKED = """
store: {{url: "sqlite:///{db}"}}
agents:
  asker: tests.bot.asking_agent:agent
rules:
  - tool: ask
{rule}
"""


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ("    reviewers: [ops@example.com]\n    when: {eq: {asked_by: ship}}", None),
        (
            "    reviewers: [ops@example.com]\n    when: {gt: {amount: 5}}",
            "'amount' is not a field of a question",
        ),
        ("    decision: approve", "answered by people"),
        ("    reviewers: [ops@example.com]\n    editable: [question]", "answered, not edited"),
    ],
    ids=["fine", "unknown-field", "decision", "editable"],
)
def test_check_config_reads_a_rule_of_ask_as_a_rule_of_questions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rule: str, problem: str | None
) -> None:
    path = tmp_path / "nodbot.yml"
    path.write_text(CHECKED.format(db=tmp_path / "n.db", rule=rule))

    status = nodbot_command(["check-config", str(path)])

    printed = capsys.readouterr()
    if problem is None:
        assert status == 0, printed
    else:
        assert status == 2 and problem in printed.err + printed.out


def test_a_question_is_answered_or_declined_whatever_policy_it_was_stored_with() -> None:
    """A question stored without the bot's rules (no `allowed_decisions`) or with a policy
    that lists approve: never approved or edited, always answerable or declinable."""
    question = make_question("Which one?", choices=["a", "b"])
    for policy in ({}, {"allowed_decisions": ["approve", "edit"]}):
        request = question_request(question, run_id="r", call_id="c", requested_by=None)
        request = replace(request, policy={**request.policy, **policy})
        record = ApprovalRecord("apr_1", request, created_at=datetime.now(UTC))
        assert rule_refusal(record, Decision(approved=True)) is not None
        assert rule_refusal(record, Decision(approved=True, edited_args={"question": "x"}))
        assert rule_refusal(record, Decision(approved=False, response="a")) is None
        assert rule_refusal(record, Decision(approved=False, reason="no")) is None
