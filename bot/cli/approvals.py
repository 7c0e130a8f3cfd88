"""`nodbot approvals list|show|decide|bulk`: the approvals of a configuration's store, from a
shell.

`list` and `show` give a reviewer's edit beside the original values (`amount 120.0 → 100`),
since the edited values are what ran; `show` gives the review's deadline and what it then
becomes, the approvals so far and needed (with who gave them), and where the review was
delivered (with why a delivery failed: a Slack channel that has not invited the bot says how
to invite it); `list --json` prints one JSON document, a list of the API's `ApprovalView`s,
for scripts.

A decision made here is a vote like one made over the API (channel `cli`), allowed by the
same rules; a running bot picks it up (at once on PostgreSQL, within `workers.poll` on
SQLite). `decide ID --respond TEXT` answers in the tool's place (where the rule lists
`respond`); `answer ID TEXT` and `decline ID` answer or decline a question
(`bot.cli.questions`, which also says how `list` and `show` give one). An answer to a
question that is none of its choices, and an approve or an edit of a question, are a bad
input (exit 2), and nothing is recorded.

`bulk approve|deny ID...` decides up to `MAX_ITEMS` reviews in one command
(`bot.bulk.Decider`), each one authorized and recorded on its own, in the order given: one
line each (the id, its outcome, why) and a summary line, or with `--json` the document
`POST /approvals/decide` answers. It exits 0 when every review was decided, 1 when some were
not, and 2 for a list that is not accepted (checked before anything is read or recorded).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from nodbot.bot.bulk import MAX_ITEMS, Decider, bulk_problem
from nodbot.bot.cli.questions import (
    NotAQuestionError,
    add_question_commands,
    describe_question,
    question_row,
    shown,
)
from nodbot.bot.config import Config, load_agents, load_config
from nodbot.bot.forms import MAX_REASON
from nodbot.bot.http.schemas import (
    ApprovalView,
    BulkDecideView,
    BulkItemView,
    approvals_of,
    bulk_view,
)
from nodbot.bot.policy.authorize import Authorizer, authorizer_for
from nodbot.bot.slack.channel import SlackChannel
from nodbot.bot.store import store_for
from nodbot.core import (
    ApprovalEvent,
    ApprovalRecord,
    ApprovalStatus,
    Decision,
    DeferredApproval,
    Delivery,
    Executor,
    InvalidDecisionError,
    NodbotError,
    SqlApprovalStore,
    ToolDecision,
    ToolRegistry,
)
from nodbot.core.questions import answer_problem, is_question
from nodbot.core.remembered import RememberedApproval
from nodbot.core.store import TIMEOUT_DECIDER

__all__ = ["add_approvals_commands", "bulk_mistake", "run_approvals_command", "run_bulk_command"]

CHANNEL = "cli"

BULK_EXIT_STATUSES = (
    "exit status: 0 every review listed was decided; 1 some were not (refused, already "
    "decided, not found, ...), or the store cannot be used (the reviews before that stay "
    f"decided); 2 a bad input (no ids, more than {MAX_ITEMS}, an id listed twice or "
    "empty, a mistake in the command line or the configuration file), and nothing is "
    "decided."
)


class RefusedError(NodbotError):
    """The rules do not allow this decision."""

    kind = "decision-refused"


def add_approvals_commands(commands: Any) -> None:
    """Add `approvals list|show|decide|bulk|remembered|forget` to the `nodbot` parser."""
    approvals = commands.add_parser("approvals", help="list, show and decide approvals")
    actions = approvals.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="approvals in creation order")
    listing.add_argument("--status", choices=["pending", "approved", "denied"])
    listing.add_argument("--run", help="only the approvals of this run")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument(
        "--json", action="store_true", help="one JSON list of the API's approval views"
    )
    show = actions.add_parser("show", help="one approval, its arguments and its events")
    show.add_argument("approval_id")
    decide = actions.add_parser(
        "decide",
        help="approve, edit, deny or respond to an approval",
        description="Decide an approval as WHO: approve, edit (with --arguments) or deny "
        "it, or answer in the tool's place with --respond TEXT (where its rule allows "
        "respond; for a question, its answer). Allowed by the rules as on every channel; "
        "recorded with channel cli.",
    )
    decide.add_argument("approval_id")
    decide.add_argument(
        "decision",
        nargs="?",
        choices=["approve", "edit", "deny"],
        metavar="{approve,edit,deny}",
        help="the decision; left out with --respond",
    )
    decide.add_argument("--as", dest="principal", required=True, metavar="WHO", help="who decides")
    decide.add_argument("--arguments", help="for edit: a JSON object, e.g. '{\"amount\": 100}'")
    decide.add_argument("--reason", help="why (the model is told, for a deny)")
    decide.add_argument(
        "--respond",
        metavar="TEXT",
        help="answer in the tool's place: the tool does not run and the model gets TEXT as "
        "its result (the rule must list respond in allowed_decisions)",
    )
    add_question_commands(actions)
    _add_bulk_command(actions)
    remembered = actions.add_parser(
        "remembered", help="the approvals reviewers asked to remember, still in force"
    )
    remembered.add_argument("--all", action="store_true", help="expired and forgotten ones too")
    forget = actions.add_parser("forget", help="end a remembered approval: it covers no more calls")
    forget.add_argument("remember_id", help="as `approvals remembered` lists it (rem_...)")
    for parser in (listing, show, decide, remembered, forget):
        parser.add_argument("--config", default="nodbot.yml", metavar="FILE")


def _add_bulk_command(actions: Any) -> None:
    """`approvals bulk approve|deny ID [ID ...]`."""
    bulk = actions.add_parser(
        "bulk",
        help=f"approve or deny several approvals at once (at most {MAX_ITEMS})",
        description=f"Approve or deny each approval listed (at most {MAX_ITEMS}), one by one "
        "in the order given, each allowed by the rules as `approvals decide` would be and "
        "recorded on its own (channel cli); one that is refused, unknown or decided already "
        "does not stop the rest. Prints one line per approval (its id, its outcome, why) "
        "and a summary line. Edits are one at a time: `approvals decide`.",
        epilog=BULK_EXIT_STATUSES,
    )
    bulk.add_argument(
        "decision", choices=["approve", "deny"], help="the same for every approval listed"
    )
    bulk.add_argument(
        "approval_ids", nargs="+", metavar="ID", help="the approvals, each listed once"
    )
    bulk.add_argument(
        "--as",
        dest="principal",
        required=True,
        metavar="WHO",
        help="who decides: a Slack user id or an email address, as in the rules' reviewers",
    )
    bulk.add_argument(
        "--reason", help="why, recorded with each decision (the model is told, for a deny)"
    )
    bulk.add_argument(
        "--json",
        action="store_true",
        help="print the document POST /approvals/decide answers instead of lines",
    )
    bulk.add_argument("--config", default="nodbot.yml", metavar="FILE")


def bulk_mistake(arguments: argparse.Namespace) -> str | None:
    """`approvals bulk`: what is wrong with its list of ids (`bulk_problem`) or its
    `--reason`, or None. Checked before the configuration is read."""
    problem = bulk_problem(arguments.approval_ids)
    if problem is not None:
        return problem
    reason = arguments.reason
    if reason is not None and len(reason) > MAX_REASON:
        return f"argument --reason: at most {MAX_REASON} characters, not {len(reason)}"
    return None


async def run_bulk_command(arguments: argparse.Namespace) -> int:
    """Run `approvals bulk`: print each approval's outcome (or the JSON document) and
    return the exit status, 0 when every one was decided, else 1. Raises `NodbotError`s
    (a `StoreError` when the store fails: the approvals before it stay decided)."""
    config = load_config(arguments.config)
    async with store_for(config) as store:
        registry, authorizer = _deciding(config, store)
        decider = Decider(store, registry, authorizer, CHANNEL)
        outcomes = await decider.decide_many(
            arguments.approval_ids,
            approved=arguments.decision == "approve",
            who=arguments.principal,
            reason=arguments.reason,
            evidence={"os_user": _os_user()},
        )
        view = await bulk_view(store, outcomes)
    if arguments.json:
        print(json.dumps(view.model_dump(mode="json"), ensure_ascii=False, indent=2))
    else:
        print(_bulk_lines(view))
    return 0 if view.not_decided == 0 else 1


def _bulk_lines(view: BulkDecideView) -> str:
    """One line per approval (id, outcome, why), aligned, and a summary line."""
    rows = [(item.approval_id, item.status, _why(item)) for item in view.results]
    id_width = max(len(row[0]) for row in rows)
    status_width = max(len(row[1]) for row in rows)
    lines = [
        f"{approval_id.ljust(id_width)}  {status.ljust(status_width)}  {why}".rstrip()
        for approval_id, status, why in rows
    ]
    count = len(rows)
    lines.append(
        f"{count} review{'' if count == 1 else 's'}: {view.decided} decided, "
        f"{view.not_decided} not decided"
    )
    return "\n".join(lines)


def _why(item: BulkItemView) -> str:
    """What became of a decided approval (approved, denied, or a vote so far), or why it
    was not decided."""
    view = item.approval
    if item.status != "decided" or view is None:
        return item.error or ""
    if view.status != "pending":
        return view.status
    return f"voted: {view.approvals} of {view.approvals_required} approvals, still pending"


async def run_approvals_command(arguments: argparse.Namespace) -> str:
    """Run one `approvals` command; returns what to print. Raises `NodbotError`s."""
    config = load_config(arguments.config)
    async with store_for(config) as store:
        if arguments.action == "list":
            status: ApprovalStatus | None = arguments.status
            records = await store.list(run_id=arguments.run, status=status, limit=arguments.limit)
            if arguments.json:
                views = [(await ApprovalView.read(store, record)) for record in records]
                found = [view.model_dump(mode="json") for view in views]
                return json.dumps(found, ensure_ascii=False, indent=2)
            return _table(records)
        if arguments.action == "show":
            record = await store.get(arguments.approval_id)
            events = await store.events(record.approval_id)
            lines = [_describe(record, events), "events:"]
            lines += [
                f"  {e.at:%Y-%m-%d %H:%M:%S} {e.kind} {_actor(e, '')} {e.channel or ''} "
                f"{json.dumps(e.detail) if e.detail else ''}".rstrip()
                for e in events
            ]
            deliveries = await store.deliveries(record.approval_id)
            if deliveries:
                lines += ["deliveries:", *(_delivery_line(d) for d in deliveries)]
            return "\n".join(lines)
        if arguments.action == "remembered":
            kept = await store.remembered.list(live=not arguments.all)
            return _remembered_table(kept)
        if arguments.action == "forget":
            gone = await store.remembered.forget(arguments.remember_id, by=f"cli:{_os_user()}")
            return f"forgotten: {gone.remember_id} ({gone.tool}, approved by {gone.decided_by})"
        return await _decide(config, store, arguments)


def _answer_of(arguments: argparse.Namespace) -> ToolDecision:
    """What `decide`, `answer` or `decline` says, as a `ToolDecision`."""
    if arguments.action == "answer":
        return ToolDecision(action="respond", message=arguments.text)
    if arguments.action == "decline":
        return ToolDecision(action="deny", message=arguments.reason)
    if arguments.respond is not None:
        return ToolDecision(action="respond", message=arguments.respond)
    edited = json.loads(arguments.arguments) if arguments.arguments else None
    return ToolDecision(
        action=arguments.decision,
        arguments=edited if arguments.decision == "edit" else None,
        message=arguments.reason,
    )


def _check_question(record: ApprovalRecord, decision: Decision, command: str) -> None:
    """Refuse, before anything is recorded, `answer` or `decline` of a call's review
    (`NotAQuestionError`), and an approve, an edit or an answer that is none of its
    choices of a question (`InvalidDecisionError`): bad inputs."""
    if not is_question(record.request):
        if command in ("answer", "decline"):
            raise NotAQuestionError(
                f"approval {record.approval_id} is a review of a call of "
                f"{record.request.tool}, not a question: decide it with `nodbot approvals "
                "decide`"
            )
        return
    if decision.approved:
        why = "a question is answered (approvals answer) or declined, not approved or edited"
        raise InvalidDecisionError(why, errors=[{"field": "action", "message": why}])
    if decision.response is not None:
        problem = answer_problem(record.request, decision.response)
        if problem is not None:
            raise InvalidDecisionError(
                f"not an answer to this question: {problem}",
                errors=[{"field": "response", "message": problem}],
            )


async def _decide(config: Config, store: SqlApprovalStore, arguments: argparse.Namespace) -> str:
    decision = _answer_of(arguments).to_decision(arguments.principal)
    record = await store.get(arguments.approval_id)
    _check_question(record, decision, arguments.action)
    registry, authorizer = _deciding(config, store)
    verdict = await authorizer.check(arguments.principal, record, decision)
    evidence = {"os_user": _os_user()}
    if verdict.refusal is not None:
        await store.refuse(
            record.approval_id,
            actor=arguments.principal,
            channel=CHANNEL,
            reason=verdict.refusal,
            person=verdict.person,
            evidence=evidence,
        )
        raise RefusedError(verdict.refusal)
    executor = Executor(registry, approval=DeferredApproval(store))
    decided = await executor.decide(
        record.approval_id,
        decision,
        channel=CHANNEL,
        person=verdict.person,
        evidence=verdict.evidence(evidence),
    )
    return _describe(decided, await store.events(decided.approval_id))


def _deciding(config: Config, store: SqlApprovalStore) -> tuple[ToolRegistry, Authorizer]:
    """The tools of the configuration's agents (they validate an edit, as over the API) and
    the authorizer of the bot (with Slack's directory when it has Slack)."""
    agents, _ = load_agents(config)
    registry = ToolRegistry.merged(agent.tools for agent in agents.values())
    slack = SlackChannel(config.slack, store, registry) if config.slack is not None else None
    return registry, authorizer_for(config, slack, runs=store)


def _delivery_line(delivery: Delivery) -> str:
    """Where the review was told, how that went, and why it failed (what to do, for a Slack
    channel that has not invited the bot)."""
    state = {"due": "waiting", "sent": "sent", "failed": "given up"}.get(
        delivery.status, delivery.status
    )
    if delivery.status == "due" and delivery.attempts:
        state = f"to be tried again at {delivery.due_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    attempts = f", {delivery.attempts} attempt(s)" if delivery.attempts else ""
    line = f"  {delivery.target} ({delivery.kind}): {state}{attempts}"
    return f"{line}: {delivery.error}" if delivery.error and delivery.status != "sent" else line


def _remembered_table(kept: Sequence[RememberedApproval]) -> str:
    if not kept:
        return "no remembered approvals"
    lines = []
    for entry in kept:
        state = "forgotten" if entry.forgotten_at else f"until {entry.expires_at:%Y-%m-%d %H:%M}"
        arguments = json.dumps(entry.arguments, ensure_ascii=False)
        lines.append(
            f"{entry.remember_id}  {entry.tool}  {arguments}  by {entry.decided_by}  "
            f"{state}  (review {entry.approval_id})"
        )
    return "\n".join(lines)


def _os_user() -> str:
    """Who runs the command, as the operating system says (recorded as evidence)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container, say)
        return f"uid:{os.getuid()}"


def _table(records: Sequence[ApprovalRecord]) -> str:
    rows = [("APPROVAL", "STATUS", "TOOL", "RUN", "DECIDED BY", "ARGUMENTS")]
    for record in records:
        decided_by = record.decision.decided_by if record.decision is not None else None
        status, cell = question_row(record) or _call_cells(record)
        rows.append(
            (
                record.approval_id,
                status,
                record.request.tool,
                record.request.run_id,
                decided_by or "-",
                cell,
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths, strict=True))
        + "  "
        + row[5]
        for row in rows
    )


def _call_cells(record: ApprovalRecord) -> tuple[str, str]:
    """A call's review's STATUS and ARGUMENTS cells: a respond is `responded`, with the
    answer given in the tool's place."""
    arguments = shown(json.dumps(record.request.arguments, ensure_ascii=False)[:60])
    decision = record.decision
    if decision is not None and decision.response is not None:
        return "responded", f"{arguments}  response: {shown(decision.response, 60)}"
    edit = _edit(record)
    return record.status, f"{arguments}  edited: {edit}" if edit else arguments


def _edit(record: ApprovalRecord) -> str:
    """The reviewer's changes, each beside the value it replaced: `amount 120.0 → 100`."""
    edited = record.decision.edited_args if record.decision is not None else None
    original = record.request.arguments
    return shown(
        ", ".join(
            f"{name} {json.dumps(original.get(name), ensure_ascii=False)} → "
            f"{json.dumps(value, ensure_ascii=False)}"
            for name, value in (edited or {}).items()
        )
    )


def _deadline(record: ApprovalRecord) -> str:
    """When the review expires, and what it then becomes."""
    deadline = record.request.deadline
    if deadline is None:
        return "  no deadline: it waits until someone decides"
    when = f"  deadline {deadline.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    if record.status != "pending":
        return when
    becomes = "approved" if record.request.on_timeout == "approve" else "denied"
    return f"{when}, then {becomes} by {TIMEOUT_DECIDER} if nobody decides"


def _actor(event: ApprovalEvent, unknown: str) -> str:
    """Who acted, and for whom when they decided as a delegate ("bob for ana")."""
    evidence = event.detail.get("evidence")
    for_whom = evidence.get("for") if isinstance(evidence, dict) else None
    actor = event.actor or unknown
    return f"{actor} for {for_whom}" if for_whom else actor


def _votes(record: ApprovalRecord, events: Sequence[ApprovalEvent]) -> str:
    """The approvals so far and needed, and who gave them."""
    approvers = [
        _actor(e, "?")
        for e in events
        if e.kind == "voted" and e.detail.get("action") in ("approve", "edit")
    ]
    count = approvals_of(record, events)
    line = f"  approvals {count} of {record.request.approvals_required}"
    return f"{line} ({', '.join(approvers)})" if approvers else line


def _describe(record: ApprovalRecord, events: Sequence[ApprovalEvent]) -> str:
    question = describe_question(record)
    if question is not None:
        return "\n".join(question)
    decision: Decision | None = record.decision
    decided = "pending"
    if decision is not None and decision.response is not None:
        decided = f"responded by {decision.decided_by}"
    elif decision is not None:
        decided = f"{record.status} by {decision.decided_by}"
        if decision.reason:
            decided += f": {shown(decision.reason)}"
    lines = [
        f"approval {record.approval_id} ({decided})",
        f"  run {record.request.run_id}, call {record.request.call_id}, "
        f"asked by {record.request.requested_by or 'nobody known'}",
        f"  {record.request.tool} "
        + shown(json.dumps(record.request.arguments, ensure_ascii=False)),
    ]
    edit = _edit(record)
    if edit:
        lines.append(f"  edited: {edit}")
    if decision is not None and decision.response is not None:
        lines.append(f"  response, in the tool's place: {shown(decision.response)}")
    lines += [_deadline(record), _votes(record, events)]
    return "\n".join(lines)
