"""The web inbox's routes: server-rendered pages where reviewers decide approvals.

| route                                  | does                                               |
|----------------------------------------|----------------------------------------------------|
| `GET /inbox/login?token=...`           | checks a sign-in link, sets the session cookie     |
| `GET /inbox/review?token=...`          | checks a review email's link, sets a session for   |
|                                        | that approval only, 303 to its page (`?action=`)   |
| `GET /inbox`                           | the pending approvals this reviewer may decide,    |
|                                        | then the decided ones they took part in: filtered, |
|                                        | searched and paged by the query (`listing`)        |
| `POST /inbox/decide`                   | approves or denies the reviews selected in the     |
|                                        | list, each on its own (`bot.bulk`)                 |
| `GET /inbox/done?act=&id=...`          | what became of each review of one such act         |
| `GET /inbox/events`                    | the list's live updates, server-sent events        |
|                                        | (`live`)                                           |
| `GET /inbox/approvals/{id}`            | one approval, its events and the decision forms    |
| `POST /inbox/approvals/{id}/decide`    | approve, edit, deny or respond (form-encoded); an  |
|                                        | approve with `remember=yes` is remembered too; a   |
|                                        | question: respond (answer) or deny (decline)       |
| `GET /inbox/remembered`                | the live remembered approvals this reviewer made   |
| `POST /inbox/remembered/{id}/forget`   | forgets one of them, 303 back to the list          |
| `POST /inbox/logout`                   | ends the session, in the store                     |
| `GET /inbox/signed-out`                | says so, after a sign-out                          |

Every POST that succeeds answers 303 with the page to show, so that a refresh of that page
never posts the form again. An approve of a destructive tool (`effects="destructive"`, or a
tool this bot does not have, as in Slack) is first sent to a confirmation step
(`?confirm=approve`) and recorded only when its form says `confirm=yes`. Times are said
relative to the inbox's clock ("in 14 min"), the exact time in the tag's `title`.

The list's selection (`POST /inbox/decide`) approves or denies each selected review the way
a single decision is made, through `bot.bulk.Decider` (the rule, person by person, then
`Executor.decide`): one event and one audit record each, `decided_by` the signed-in
reviewer, channel `web`, the evidence naming the session and the act (`act`, random). A
selected id the reviewer may not see is answered as unknown and nothing is recorded of it.
An approve that selects a destructive tool first shows a confirmation step listing them.
The answer, `GET /inbox/done`, is read back from the store by the act's own events, review
by review (decided, not allowed and why, already decided by whom), so that it is the same on
every replica and after a restart.

A page with a script of its own (the list's live updates and keys, the review's keys) has it
inline, allowed by a nonce made for that response (`script-src 'nonce-...'`); only the list
may fetch (`connect-src 'self'`), and every page works with scripts off.

Where the call's rule has `remember:` (`bot.remember`), the approve form also offers
"Approve and remember" (`remember=yes`, kept through the confirmation step): the approval is
recorded as any other, then remembered as the API's `remember: true` does, so that a later
identical call (its `remember_by` arguments) is approved at once as this reviewer's decision.
A `remember` on a rule without `remember:`, or with an edit or a deny, is refused (422) and
records nothing. `/inbox/remembered` lists the live ones the signed-in reviewer made (by
handle, or as the same person through `People`), each with a Forget button; anyone else's is
answered as an unknown id (404), and a session limited to one approval may open neither.

Where the call's rule lists `respond`, the page offers "Respond instead": a text the agent
gets as the call's result in the tool's place (the tool does not run), needed and at most
`MAX_RESPONSE` characters; a blank or longer one is shown again with what is wrong (422),
and nothing is recorded. Without `respond` in the rule there is no such form, and a posted
respond is refused (403, recorded) like any decision the rule does not allow.

A question to a person (`core.questions`, a review of the pseudo-tool `ask`) is shown as
one (`bot.web.questions`): its text, who asked (the tool, the run, the requester), the
deadline, and an answer form (its choices as radio buttons, or a text of at most
`MAX_RESPONSE` characters) beside a Decline form; never Approve or Edit. The answer is a
respond, decided as any decision here; one that is blank, too long or none of the choices is
shown again with what is wrong (422), and nothing is recorded. A form that asks a question
for anything but an answer or a decline is refused the same way; a second answer is a 409
naming who answered first. The list shows it as a question, with no box to tick: selected
reviews are approved or denied, which a question is not, so one selected anyway is left as
it is. Once decided it says "answered" (with the answer), "declined" or "timed out", never
"denied".

The edit form is built from the tool's model for the tools this bot has, and for a tool that
runs elsewhere from the JSON schema its caller sent with `POST /approvals` (`policy["schema"]`),
against which `Executor.decide` checks the edit.

An approval is shown (and decided) only to those who may see it (`WebInbox._may_see`): its
reviewers as the rule has them, its requester, and whoever voted on it or decided it; to
anyone else its page is the one of an unknown id (404), so that its existence is not told.
A decision goes the way of the API's: the rule's policy allows it, person by person
(`bot.authorize.Authorizer`: the signed-in address is the same reviewer as its Slack user),
then `Executor.decide` validates an edit with the tool's model and records it, with
`decided_by` the signed-in reviewer and channel `web`. Every page escapes what it shows:
arguments come from a model and are not trusted.

A session is a signed cookie (`bot.web.signing`), checked on every request against the
store's revocations (`SessionRevocations`: sign-outs, and `nodbot sessions revoke`), so
that a session ended on one replica, or before a restart, is ended on all. A check that
cannot be made trusts nobody: the page is a 503 asking to try again.

A review link (the approve / edit / deny links of a review email, `bot.email.channel`) is
signed for one reviewer, one approval and the decision its button offers, and works as long
as the email's reply token. Opening it decides nothing (mail scanners open links): it is
checked like a sign-in link (signature, expiry, and the revocations of its reviewer made
after it was sent), sets a session limited to that approval (`Session.only`) and answers
303 with the approval's page, the offered decision's form picked out (`?action=deny`
focuses the reason). A link that is refused (403) signs nobody in and leaves the browser's
session as it was. Only that page's form, with its CSRF token, decides, recorded like any
inbox decision and with the evidence `{"via": "email link"}`. A limited session is refused
(403, saying why) the inbox's list and every other approval, whether it exists or not; a
browser already signed in to the whole inbox as the same reviewer keeps that session.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from nodbot.bot.bulk import MAX_ITEMS, Decider, ItemOutcome, bulk_problem
from nodbot.bot.config import WebConfig
from nodbot.bot.forms import (
    MAX_REASON,
    EditField,
    edit_fields,
    parse_edit,
    reason_too_long,
    shown,
)
from nodbot.bot.http import AuthorizeDecision
from nodbot.bot.http.approvals import refuse_self_approval
from nodbot.bot.metrics import METRICS
from nodbot.bot.policy.authorize import Authorizer
from nodbot.bot.policy.delegation import Delegations, checked_delegation, delegations_of
from nodbot.bot.policy.people import IdentityUnavailable, People
from nodbot.bot.policy.remember import NOT_REMEMBERED, remember_decision, remembered_of, scope_of
from nodbot.bot.policy.rules import SELF_APPROVAL_REASON, rule_refusal
from nodbot.bot.service import BotService
from nodbot.bot.web.arguments import argument_rows
from nodbot.bot.web.history import EventView, event_view, handles_to_name, name_of_person
from nodbot.bot.web.listing import AGES, PAGE_SIZE, QueryError, list_page, parse_query
from nodbot.bot.web.live import LiveUpdates, StreamRefused
from nodbot.bot.web.questions import outcome_class, outcome_word, question_view
from nodbot.bot.web.signing import ReviewLink, Session, Signer, TokenError, link_for
from nodbot.bot.web.slack_links import SlackMessage, Workspace, slack_messages
from nodbot.core import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyVoted,
    ApprovalEvent,
    ApprovalNotFound,
    ApprovalRecord,
    ApprovalStore,
    Decision,
    DeferredApproval,
    Executor,
    InvalidArgumentsError,
    InvalidDecisionError,
    RunNotFound,
    RunStore,
    StoreError,
    ToolDecision,
    ToolMessage,
    ToolRegistry,
    UnknownToolError,
)
from nodbot.core.decisions import MAX_RESPONSE, response_problem
from nodbot.core.delegations import Delegation, DelegationNotFound
from nodbot.core.outbox import Outbox
from nodbot.core.questions import answer_problem, is_question
from nodbot.core.remembered import RememberedApproval, RememberedNotFound
from nodbot.core.store import SessionRevocations, utc_now

__all__ = ["CHANNEL", "COOKIE", "WebInbox"]

log = logging.getLogger(__name__)

"""The pages' templates, in the repository's top-level `templates/web/`."""

CHANNEL = "web"
COOKIE = "nodbot_session"
MAX_FORM_BYTES = 1_000_000
MAX_ID = 64
"""The longest approval id a bulk form may select (the store's are 32 characters)."""
REFRESH = 30
"""Seconds after which the list reloads itself when scripts are off."""
NAMES_WAIT = 2.0
"""Seconds a review's page waits, in all, for the names of the handles in its history."""
MAX_NAMED = 20
"""The most handles of one page's history whose names are asked for."""

Action: TypeAlias = Literal["approve", "edit", "deny", "respond"]
ACTIONS: tuple[Action, ...] = ("approve", "edit", "deny", "respond")
RESPOND_PROBE = "(the answer to come)"
"""The text of the respond the page asks the rules about: only its kind counts."""

HOW_TO_SIGN_IN = (
    "Ask whoever runs nodbot for a sign-in link (they make one with "
    "nodbot inbox-link --config nodbot.yml --reviewer <your id or email address>) and open "
    "it in this browser."
)

_CSP = (
    "default-src 'none'; {scripts}style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    # No script runs on these pages and nothing is loaded from elsewhere; no other site may
    # frame them (a framed Approve button could be clicked unknowingly). A page with a
    # script of its own (`_SCRIPTED`) says so in its own header, with its nonce.
    "Content-Security-Policy": _CSP.format(scripts=""),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


_SCRIPTED = {"inbox.html": True, "approval.html": False}
"""The pages whose inline script (the keyboard's, the list's live updates) runs, allowed by
a nonce made for each response; True: the script may fetch from the bot too."""


def _csp(nonce: str, connect: bool) -> str:
    """The Content-Security-Policy of a page with a script: that of every page, and only
    the scripts that carry `nonce` (and, with `connect`, fetches of this site's own pages)."""
    scripts = f"script-src 'nonce-{nonce}'; " + ("connect-src 'self'; " if connect else "")
    return _CSP.format(scripts=scripts)


class PageError(Exception):
    """An error page: its HTTP status, a title and one paragraph saying what to do."""

    def __init__(
        self, status: int, title: str, message: str, *, approval_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message
        self.approval_id = approval_id


Handler: TypeAlias = Callable[[Request], Awaitable[Response]]


class WebInbox:
    """The inbox of one bot: its routes (`routes()`, mounted by `create_app`), and the secret
    that signs its links, sessions and forms (`web.secret`, or a random one made here: links
    and sessions then last as long as this process)."""

    def __init__(
        self,
        *,
        store: ApprovalStore,
        registry: ToolRegistry,
        web: WebConfig,
        service: BotService | None = None,
        authorize: AuthorizeDecision = refuse_self_approval,
        people: People | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        secret = web.secret.get_secret_value() if web.secret is not None else None
        self.web = web
        self.store = store
        self.registry = registry
        self.service = service
        self.authorize = authorize
        if people is None:
            people = authorize.people if isinstance(authorize, Authorizer) else People()
        self.people = people
        """Who is who, to tell the requester (the authorizer's, when it is an `Authorizer`)."""
        self.signer = Signer(secret or secrets.token_urlsafe(32), clock=clock)
        self.executor = Executor(registry, approval=DeferredApproval(store))
        self.secure = (web.public_url or "").startswith("https://")
        self.counters: dict[str, int] = {"decisions": 0}
        self._clock = clock
        self.decider = Decider(store, registry, authorize, CHANNEL, on_decided=self._decided)
        """Decides the list's selected reviews, each as a single decision is (`bot.bulk`)."""
        self.live = LiveUpdates(store, self._may_decide)
        """The list's live updates (`bot.web.live`); `close` ends them."""
        self.sessions = _revocations_of(store)
        """Where ended sessions are kept: the store's, seen by every replica."""
        self._schemas: dict[str, dict[str, Any]] = {}  # tool -> its arguments' JSON schema
        self._workspace = Workspace()  # the Slack workspace's address, for message links
        self.templates = Environment(
            # Package data of `nodbot`, in the repository and in an installed wheel alike.
            loader=PackageLoader("nodbot", "templates/web"),
            autoescape=select_autoescape(("html",), default_for_string=True, default=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["span"] = self._span
        self.templates.filters["short"] = _short
        self.templates.globals["edits"] = _edits
        self.templates.globals["max_reason"] = MAX_REASON
        self.templates.filters["shown"] = shown
        self.templates.filters["compact"] = _compact
        self.templates.globals["question_view"] = question_view
        self.templates.globals["outcome_word"] = outcome_word
        self.templates.globals["outcome_class"] = outcome_class

    def sign_in_link(self, principal: str, base: str) -> str:
        """A sign-in link for `principal`, signed with this inbox's secret; `base` is the
        bot's address, used unless `web.public_url` is set. Raises `SignInLinkError`."""
        return link_for(self.signer, self.web, principal, base)

    def close(self) -> None:
        """End the list's live streams now, and open no more: the server is stopping, and
        waits for every open response."""
        self.live.close()

    def routes(self) -> list[Route]:
        """The inbox's routes, all under `/inbox`."""
        return [
            Route("/inbox", self._page(self.inbox), methods=["GET"]),
            Route("/inbox/decide", self._page(self.decide_selected), methods=["POST"]),
            Route("/inbox/done", self._page(self.done), methods=["GET"]),
            Route("/inbox/events", self._page(self.events), methods=["GET"]),
            Route("/inbox/login", self._page(self.login), methods=["GET"]),
            Route("/inbox/review", self._page(self.review), methods=["GET"]),
            Route("/inbox/logout", self._page(self.logout), methods=["POST"]),
            Route("/inbox/signed-out", self._page(self.signed_out), methods=["GET"]),
            Route("/inbox/approvals/{approval_id}", self._page(self.approval), methods=["GET"]),
            Route(
                "/inbox/approvals/{approval_id}/decide",
                self._page(self.decide),
                methods=["POST"],
            ),
            Route("/inbox/remembered", self._page(self.remembered), methods=["GET"]),
            Route(
                "/inbox/remembered/{remember_id}/forget",
                self._page(self.forget),
                methods=["POST"],
            ),
            Route("/inbox/settings", self._page(self.settings), methods=["GET"]),
            Route("/inbox/settings/delegate", self._page(self.delegate), methods=["POST"]),
            Route(
                "/inbox/settings/delegations/{delegation_id}/end",
                self._page(self.end_delegation),
                methods=["POST"],
            ),
        ]

    # --- pages ------------------------------------------------------------------------------

    async def login(self, request: Request) -> Response:
        token = request.query_params.get("token", "")
        try:
            principal = self.signer.principal_of_link(token)
        except TokenError as exc:
            what = (
                "This sign-in link has expired."
                if exc.reason == "expired"
                else "This sign-in link is not valid: it was changed, cut short, or made "
                "with another secret (or before the bot restarted)."
            )
            raise PageError(401, "Sign-in link not accepted", f"{what} {_NEW_LINK}") from None
        _, cookie = self.signer.new_session(principal, self.web.session_ttl)
        log.info("%s signed in to the web inbox", principal)
        response = RedirectResponse("/inbox", status_code=303)
        self._set_cookie(response, cookie, self.web.session_ttl)
        return response

    async def review(self, request: Request) -> Response:
        """A review email's link: never decides, only signs in (for that approval)."""
        link = await self._review_link(request.query_params.get("token", ""))
        page = f"/inbox/approvals/{quote(link.approval_id)}?action={link.action}"
        response = RedirectResponse(page, status_code=303)
        current = await self._current_session(request)
        if (
            current is not None
            and current.only is None
            and current.principal.lower() == link.principal.lower()
        ):
            return response  # the whole inbox already: not narrowed to one approval
        # Never longer than the link itself works.
        ttl = min(self.web.session_ttl, link.expires - int(self._clock()))
        _, cookie = self.signer.new_session(link.principal, ttl, only=link.approval_id)
        log.info("%s signed in by link for approval %s", link.principal, link.approval_id)
        self._set_cookie(response, cookie, ttl)
        return response

    async def logout(self, request: Request) -> Response:
        session = await self._session(request)
        form = await _form(request)
        self._check_csrf(session, form)
        try:
            await self.sessions.revoke_session(
                session.session_id, until=_moment(session.expires), at=_moment(self._clock())
            )
        except StoreError as exc:
            # The cookie stays: the sign-out can be tried again, and is not said to be done.
            log.warning("a sign-out could not be recorded: %s", exc)
            raise PageError(
                503,
                "Not signed out",
                "The inbox cannot record the sign-out now: the approval store cannot be "
                "used. Try again shortly.",
            ) from None
        response = RedirectResponse("/inbox/signed-out", status_code=303)
        response.delete_cookie(COOKIE, path="/inbox", secure=self.secure, httponly=True)
        return response

    async def signed_out(self, request: Request) -> Response:
        return self._render(
            "message.html",
            200,
            None,
            title="Signed out",
            message="You are signed out. Open a new sign-in link to come back.",
        )

    async def inbox(self, request: Request) -> Response:
        """The list: pending reviews the reviewer may decide, then decided ones they took
        part in, filtered and paged by the query (`bot.web.listing`)."""
        session = await self._session(request)
        _within(session, None)
        try:
            query = parse_query(request.query_params.multi_items())
        except QueryError as exc:
            raise PageError(
                422,
                "Filters not understood",
                f"The list was not shown: {'; '.join(exc.problems)}. Change the filters, or "
                "open the inbox without them.",
            ) from None
        who = session.principal

        async def may_decide(record: ApprovalRecord) -> bool:
            return await self._may_decide(who, record)

        async def involved(record: ApprovalRecord) -> bool:
            return await self._involved(who, record)

        found = await list_page(
            self.store,
            query,
            now=_moment(self._clock()),
            may_decide=may_decide,
            involved=involved,
        )
        return self._render(
            "inbox.html",
            200,
            session,
            query=query,
            listing=found,
            pending=[await self._pending_row(who, record) for record in found.pending],
            decided=found.decided,
            version=await self.live.version(who),
            ages=AGES,
            page_size=PAGE_SIZE,
            refresh=REFRESH,
            max_items=MAX_ITEMS,
        )

    async def decide_selected(self, request: Request) -> Response:
        """Approve or deny the reviews selected in the list, each authorized and recorded on
        its own (`bot.bulk.Decider`), then 303 to what became of each (`done`)."""
        session = await self._session(request)
        _within(session, None)
        pairs = await _form_pairs(request)
        form = _first_values(pairs)
        self._check_csrf(session, form)
        who = session.principal
        action = form.get("action", "")
        if action not in ("approve", "deny"):
            raise PageError(
                422,
                "Unknown decision",
                f"The form asked for {action[:40]!r}; selected reviews are approved or denied "
                "(an edit is made on the review's own page). Nothing was recorded.",
            )
        ids = [value for name, value in pairs if name == "id"]
        problem = _selection_problem(ids)
        if problem is not None:
            raise PageError(422, "Nothing decided", f"{problem}. Nothing was recorded.")
        reason = form.get("reason", "").strip() or None
        too_long = reason_too_long(reason)
        if too_long is not None:
            said = f"{too_long[0].upper()}{too_long[1:]}"
            raise PageError(422, "Reason too long", f"{said}: nothing was recorded.")
        # What the reviewer may not see is answered as unknown: neither decided nor refused,
        # so that nothing tells it exists.
        seen = [found for found in [await self._seen(who, i) for i in ids] if found is not None]
        # A question is answered or declined on its own page, never approved or denied with
        # others: one selected anyway is left as it is (its outcome says so).
        seen = [record for record in seen if not is_question(record.request)]
        if action == "approve" and form.get("confirm") != "yes":
            destructive = [r for r in seen if r.decision is None and self._destructive(r)]
            if destructive:
                return self._render(
                    "inbox_confirm.html",
                    200,
                    session,
                    ids=ids,
                    reason=reason or "",
                    destructive=destructive,
                )
        act = secrets.token_hex(8)
        evidence = {"session": _session_ref(session), "act": act}
        outcomes: list[ItemOutcome] = []
        if seen:
            try:
                outcomes = await self.decider.decide_many(
                    [record.approval_id for record in seen],
                    approved=action == "approve",
                    who=who,
                    reason=reason,
                    evidence=evidence,
                )
            except StoreError as exc:
                log.warning("a decision of selected reviews stopped: %s", exc)
                raise PageError(
                    503,
                    "Try again shortly",
                    "The approval store failed during the decision: the reviews before the "
                    "failure may be decided, the others are not. Open the inbox to see which.",
                ) from None
        self.counters["decisions"] += sum(outcome.ok for outcome in outcomes)
        params = [("act", act), ("action", action), *(("id", i) for i in ids)]
        return RedirectResponse(f"/inbox/done?{urlencode(params)}", status_code=303)

    async def done(self, request: Request) -> Response:
        """What became of each review of one act of the list (`decide_selected`), read back
        from the store: the act's own events say it, so the page is the same on every
        replica, and tells nothing that did not happen."""
        session = await self._session(request)
        _within(session, None)
        act = request.query_params.get("act", "")
        action = request.query_params.get("action", "")
        ids = request.query_params.getlist("id")
        if (
            not _ACT.fullmatch(act)
            or action not in ("approve", "deny")
            or _selection_problem(ids) is not None
        ):
            raise PageError(
                404,
                "No such decision",
                "This address does not name a decision made in your inbox. Open the inbox to "
                "see where your reviews stand.",
            )
        who = session.principal
        person = await self._person_of(who)
        items = [await self._act_outcome(who, person, act, i) for i in ids]
        return self._render(
            "inbox_done.html",
            200,
            session,
            items=items,
            action=action,
            recorded=sum(item["status"] in ("decided", "voted") for item in items),
        )

    async def events(self, request: Request) -> Response:
        """The list's live updates: a server-sent event stream (`bot.web.live`)."""
        session = await self._session(request)
        _within(session, None)
        try:
            stream = self.live.stream(session.principal)
        except StreamRefused as exc:
            raise PageError(
                503,
                "No live updates now",
                f"The list is not updated live now: {exc}. It still works: reload it to see "
                "new reviews.",
            ) from None
        return StreamingResponse(
            stream, media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
        )

    async def approval(self, request: Request) -> Response:
        session = await self._session(request)
        _within(session, request.path_params["approval_id"])
        record = await self._visible(session.principal, request.path_params["approval_id"])
        confirming = request.query_params.get("confirm") == "approve"
        asked = request.query_params.get("action")
        chosen = next((action for action in ACTIONS if action == asked), None)
        return await self._approval_page(
            session,
            record,
            confirming=confirming,
            chosen=chosen,
            remembering=request.query_params.get("remember") == "yes",
        )

    async def decide(self, request: Request) -> Response:
        session = await self._session(request)
        _within(session, request.path_params["approval_id"])
        form = await _form(request)
        self._check_csrf(session, form)
        who = session.principal
        record = await self._visible(who, request.path_params["approval_id"])
        action = form.get("action", "")
        if action not in ACTIONS:
            raise PageError(
                422,
                "Unknown decision",
                f"The form asked for {action!r}; a decision is approve, edit, deny or respond.",
                approval_id=record.approval_id,
            )
        question = is_question(record.request)
        if question and action not in ("respond", "deny"):
            raise PageError(
                422,
                "Not an answer",
                f"The form asked for {action!r}; a question is answered or declined. Nothing "
                "was recorded.",
                approval_id=record.approval_id,
            )
        remember = form.get("remember")
        if remember is not None:
            self._check_remember(record, action, remember)
        evidence = {"session": _session_ref(session)}
        if session.only is not None:
            evidence["via"] = "email link"
        if action == "edit":
            _, actions = await self._actions(who, record)
            if actions["edit"] is not None:
                await self._refuse(record, who, None, actions["edit"], evidence)
        reason = form.get("reason", "").strip() or None
        too_long = reason_too_long(reason)
        if too_long is not None:
            fields = parse_edit(self._fields(record), form, record.request.arguments).fields
            return await self._approval_page(
                session,
                record,
                status=422,
                fields=fields if action == "edit" else None,
                reason=reason,
                problem=f"{too_long[0].upper()}{too_long[1:]}: nothing was recorded.",
            )
        decision = Decision(approved=action != "deny", reason=reason, decided_by=who)
        if action == "respond":
            response = form.get("response", "").strip()
            # A question's answer is checked as the question has it (one of its choices).
            wrong = (
                answer_problem(record.request, response) if question else response_problem(response)
            )
            if wrong is not None:
                return await self._approval_page(
                    session,
                    record,
                    status=422,
                    response=response,
                    problem=f"{wrong[0].upper()}{wrong[1:]}: nothing was recorded.",
                )
            decision = Decision(approved=False, response=response, decided_by=who)
        if action == "edit":
            if record.decision is not None:  # nothing to show beside the fields any more
                raise _already_decided(record.approval_id, record.decision.decided_by)
            parsed = parse_edit(self._fields(record), form, record.request.arguments)
            if parsed.errors:
                return await self._approval_page(
                    session,
                    record,
                    status=422,
                    fields=parsed.fields,
                    reason=reason,
                    problem="Some values could not be read (see below); nothing was recorded.",
                )
            if not parsed.edited:
                return await self._approval_page(
                    session,
                    record,
                    status=422,
                    fields=parsed.fields,
                    reason=reason,
                    problem="Nothing was changed: use Approve to run the call as it is.",
                )
            answer = ToolDecision(action="edit", arguments=parsed.edited, message=reason)
            decision = answer.to_decision(who)
        verdict = await self.authorize(who, record, decision)
        if verdict.refusal is not None:
            await self._refuse(record, who, verdict.person, verdict.refusal, evidence)
        if action == "approve" and form.get("confirm") != "yes" and self._destructive(record):
            # Asked only of a decision that could still be recorded, as Slack's dialog is.
            if record.decision is not None:
                raise _already_decided(record.approval_id, record.decision.decided_by)
            votes = await self._votes(record)
            if any(_is_voter(e, who, verdict.person) for e in votes):
                raise _already_voted(record.approval_id)
            again = "&remember=yes" if remember is not None else ""
            return RedirectResponse(
                f"/inbox/approvals/{quote(record.approval_id)}?confirm=approve{again}",
                status_code=303,
            )
        try:
            decided = await self.executor.decide(
                record.approval_id,
                decision,
                decided_by=who,
                channel=CHANNEL,
                person=verdict.person,
                evidence=verdict.evidence(evidence),  # and whom for, when by a delegation
            )
        except ApprovalAlreadyDecided as exc:
            if question:
                raise _already_answered(await self.store.get(record.approval_id)) from None
            raise _already_decided(record.approval_id, exc.decided_by) from None
        except ApprovalAlreadyVoted:
            raise _already_voted(record.approval_id) from None
        except InvalidDecisionError as exc:
            if not question:
                raise PageError(
                    422, "Decision not accepted", str(exc), approval_id=record.approval_id
                ) from None
            # The question's own check, made again where the answer is recorded.
            return await self._approval_page(
                session,
                record,
                status=422,
                response=decision.response,
                problem=f"{str(exc)[0].upper()}{str(exc)[1:]}: nothing was recorded.",
            )
        except InvalidArgumentsError as exc:
            errors = {error["field"].split(".", 1)[0]: error["message"] for error in exc.errors}
            fields = parse_edit(self._fields(record), form, record.request.arguments).fields
            marked = [
                replace(spec, error=errors.pop(spec.name)) if spec.name in errors else spec
                for spec in fields
            ]
            rest = "; ".join(f"{name}: {message}" for name, message in errors.items())
            return await self._approval_page(
                session,
                record,
                status=422,
                fields=marked,
                reason=reason,
                problem="The tool does not accept these values; nothing was recorded."
                + (f" {rest}" if rest else ""),
            )
        except UnknownToolError as exc:
            raise PageError(
                422, "Decision not accepted", str(exc), approval_id=record.approval_id
            ) from None
        self.counters["decisions"] += 1
        METRICS.decided(decided, CHANNEL)
        if self.service is not None:
            self.service.decided()  # the run may be ready to go on
        if remember is not None and decided.status == "approved":
            await self._remember(decided, verdict.person)
        return RedirectResponse(f"/inbox/approvals/{quote(record.approval_id)}", status_code=303)

    async def remembered(self, request: Request) -> Response:
        session = await self._session(request)
        _within(session, None)
        kept = remembered_of(self.store)
        mine: list[RememberedApproval] = []
        if kept is not None:
            person = await self._person_of(session.principal)
            mine = [
                found
                for found in await kept.list(live=True)
                if _made_by(found, session.principal, person)
            ]
        return self._render(
            "remembered.html", 200, session, remembered=mine, kept_here=kept is not None
        )

    async def forget(self, request: Request) -> Response:
        session = await self._session(request)
        _within(session, None)
        form = await _form(request)
        self._check_csrf(session, form)
        who = session.principal
        remember_id = request.path_params["remember_id"]
        kept = remembered_of(self.store)
        if kept is None:
            raise _not_remembered(remember_id)
        person = await self._person_of(who)
        found = next((k for k in await kept.list(live=False) if k.remember_id == remember_id), None)
        if found is None or not _made_by(found, who, person):
            # Someone else's is answered as one that does not exist: its existence is not told.
            raise _not_remembered(remember_id)
        try:
            await kept.forget(remember_id, by=who)
        except RememberedNotFound:
            raise _not_remembered(remember_id) from None
        log.info(
            "remembered approval forgotten in the web inbox",
            extra={"remember_id": remember_id, "approval_id": found.approval_id, "by": who},
        )
        return RedirectResponse("/inbox/remembered", status_code=303)

    async def settings(self, request: Request) -> Response:
        session = await self._session(request)
        _within(session, None)
        return await self._settings_page(session)

    async def delegate(self, request: Request) -> Response:
        """Hand the signed-in reviewer's reviews to someone until a date (out of office)."""
        session = await self._session(request)
        _within(session, None)
        form = await _form(request)
        self._check_csrf(session, form)
        stored = delegations_of(self.store)
        who = session.principal
        fields = {key: form.get(key, "") for key in ("to", "until", "reason")}
        now = utc_now()
        try:
            if stored is None:
                raise ValueError("this bot's store keeps no delegations")
            asked = checked_delegation(
                who, fields["to"], fields["until"], fields["reason"] or None, now=now
            )
            if await self.people.same(who, asked.delegate):
                raise ValueError("a reviewer cannot hand their reviews to themselves")
        except (ValueError, IdentityUnavailable) as exc:
            return await self._settings_page(session, status=422, problem=str(exc), form=fields)
        made = await stored.add(
            delegator=asked.delegator,
            delegate=asked.delegate,
            since=now,
            until=asked.until,
            reason=asked.reason,
            created_by=f"inbox:{who}",
        )
        log.info(
            "reviews delegated in the web inbox",
            extra={"delegation_id": made.delegation_id, "by": who, "to": made.delegate},
        )
        return RedirectResponse("/inbox/settings", status_code=303)

    async def end_delegation(self, request: Request) -> Response:
        """End one of the signed-in reviewer's own delegations now."""
        session = await self._session(request)
        _within(session, None)
        form = await _form(request)
        self._check_csrf(session, form)
        delegation_id = request.path_params["delegation_id"]
        stored = delegations_of(self.store)
        mine = await self._delegations_of(session.principal) if stored else ([], [])
        if stored is None or delegation_id not in {d.delegation_id for d in mine[0]}:
            # Someone else's is answered as one that does not exist: its existence is not told.
            raise _no_delegation(delegation_id)
        try:
            await stored.end(delegation_id, by=f"inbox:{session.principal}")
        except DelegationNotFound:
            raise _no_delegation(delegation_id) from None
        log.info(
            "delegation ended in the web inbox",
            extra={"delegation_id": delegation_id, "by": session.principal},
        )
        return RedirectResponse("/inbox/settings", status_code=303)

    async def _settings_page(
        self,
        session: Session,
        *,
        status: int = 200,
        problem: str | None = None,
        form: Mapping[str, str] | None = None,
    ) -> Response:
        mine, handed_to_me = await self._delegations_of(session.principal)
        return self._render(
            "settings.html",
            status,
            session,
            mine=mine,
            handed_to_me=handed_to_me,
            kept_here=delegations_of(self.store) is not None,
            problem=problem,
            form=form or {},
        )

    async def _delegations_of(self, who: str) -> tuple[list[Delegation], list[Delegation]]:
        """The delegations, live or to come, that hand `who`'s reviews on (the file's
        standing ones included), and those that hand others' reviews to them."""
        book = self._book()
        found = list(book.standing)
        if book.stored is not None:
            found += await book.stored.list(live=True)
        now = utc_now()
        found = [d for d in found if d.until is None or now < d.until]
        person = await self._person_of(who)
        handle = who.lower()

        async def is_them(handle_of: str) -> bool:
            if handle_of.lower() == handle:
                return True
            return person is not None and await self._person_of(handle_of) == person

        mine = [d for d in found if await is_them(d.delegator)]
        to_me = [d for d in found if await is_them(d.delegate)]
        return mine, to_me

    def _book(self) -> Delegations:
        if isinstance(self.authorize, Authorizer) and self.authorize.delegations is not None:
            return self.authorize.delegations
        return Delegations(self.people, stored=delegations_of(self.store))

    # --- helpers ----------------------------------------------------------------------------

    async def _approval_page(
        self,
        session: Session,
        record: ApprovalRecord,
        *,
        status: int = 200,
        fields: list[EditField] | None = None,
        reason: str | None = None,
        problem: str | None = None,
        confirming: bool = False,
        chosen: Action | None = None,
        remembering: bool = False,
        response: str | None = None,
    ) -> Response:
        """The approval's page; `chosen` (a review link's decision) picks its form out,
        `remembering` keeps an "approve and remember" through the confirmation step, and
        `response` is a respond's text shown again (one that was not accepted)."""
        who = session.principal
        events = await self.store.events(record.approval_id)
        voted = [e for e in events if e.kind == "voted"]
        person, actions = await self._actions(who, record)
        has_voted = any(person in (e.person, e.actor) for e in voted)
        if record.status != "pending" or has_voted:
            actions = {}
        description: str | None = None
        if record.request.tool in self.registry:
            description = self.registry.get(record.request.tool).description
        slack = await self._slack_messages(record)
        dms = [message.to for message in slack if message.place == "dm"]
        names = await self._names(list(dict.fromkeys(handles_to_name(events) + dms)))
        remember = self._remember_offer(record)
        question = question_view(record)
        return self._render(
            "approval.html",
            status,
            session,
            record=record,
            policy=record.request.policy,
            tool_description=description,
            arguments=argument_rows(record.request.arguments, _edited(record)),
            events=[
                _event(e, names, question=None if question is None else question.state)
                for e in events
            ],
            votes=[_voter(e, names) for e in voted],
            slack=slack,
            names=names,
            voted=has_voted,
            actions=actions,
            may_decide=any(reason is None for reason in actions.values()),
            fields=fields if fields is not None else self._fields(record),
            reason=reason or "",
            response=response or "",
            max_response=MAX_RESPONSE,
            problem=problem,
            edited=_edited(record),
            destructive=self._destructive(record),
            confirming=confirming and actions.get("approve", "") is None,
            chosen=chosen if chosen is not None and actions.get(chosen, "") is None else None,
            question=question,
            result=await self._result(record) if record.finished and not question else None,
            remember=remember,
            remembering=remembering and remember is not None,
            remembered=await self._remembered_from(record) if remember is not None else None,
        )

    async def _names(self, handles: list[str]) -> dict[str, str]:
        """The names to show for `handles` (lower case), as far as `People` tells them at
        once: a `people:` entry's name, or the address Slack holds for a Slack user id.
        A handle it cannot tell now, or within `NAMES_WAIT` seconds in all, keeps its
        handle: a name is a convenience, and the page is not held up for it."""
        found: dict[str, str] = {}
        try:
            async with asyncio.timeout(NAMES_WAIT):
                for handle in handles[:MAX_NAMED]:
                    try:
                        person = await self.people.person(handle)
                    except IdentityUnavailable:
                        continue
                    name = name_of_person(person.key)
                    if name is not None and name.lower() != handle.lower():
                        found[handle.lower()] = name
        except TimeoutError:
            log.debug("names of the history not all known within %s s", NAMES_WAIT)
        return found

    async def _slack_messages(self, record: ApprovalRecord) -> list[SlackMessage]:
        """The review's messages in Slack, linked (`bot.web.slack_links`); none when the
        store keeps no deliveries, or the review was never posted there."""
        if not isinstance(self.store, Outbox):
            return []
        deliveries = await self.store.deliveries(record.approval_id)
        if not any(d.channel == "slack" and d.ref for d in deliveries):
            return []
        directory = self.people.directory
        workspace = await self._workspace.address(directory.client if directory else None)
        return slack_messages(deliveries, workspace)

    def _remember_offer(self, record: ApprovalRecord) -> dict[str, Any] | None:
        """What "approve and remember" would keep (for how many seconds, and the arguments
        it is scoped to, None: all), or None where the rule remembers nothing."""
        if scope_of(record.request) is None or remembered_of(self.store) is None:
            return None
        policy = record.request.policy
        by = policy.get("remember_by")
        return {
            "seconds": float(policy["remember"]),
            "by": [str(name) for name in by] if isinstance(by, list) else None,
        }

    async def _remembered_from(self, record: ApprovalRecord) -> RememberedApproval | None:
        """The live remembered approval made in the review of `record`, if any."""
        kept = remembered_of(self.store)
        if kept is None or record.status != "approved":
            return None
        found = [k for k in await kept.list(live=True) if k.approval_id == record.approval_id]
        return found[0] if found else None

    def _check_remember(self, record: ApprovalRecord, action: str, remember: str) -> None:
        """Refuse a `remember` this decision cannot have, before anything is recorded.
        Raises `PageError` 422."""
        why: str | None = None
        if remember != "yes":
            why = f"The form asked to remember {remember[:40]!r}; only yes is understood."
        elif action != "approve":
            why = (
                "Only an approve is remembered: use Approve and remember, or decide without "
                "remembering."
            )
        elif self._remember_offer(record) is None:
            why = f"{NOT_REMEMBERED[0].upper()}{NOT_REMEMBERED[1:]}."
        if why is not None:
            raise PageError(
                422,
                "Not remembered",
                f"{why} Nothing was recorded.",
                approval_id=record.approval_id,
            )

    async def _remember(self, decided: ApprovalRecord, person: str | None) -> None:
        """Remember the approval just recorded. Raises `PageError` when it cannot be: the
        approval stands, and later calls are reviewed as before."""
        try:
            kept = await remember_decision(self.store, decided, person=person)
        except (ValueError, StoreError) as exc:
            log.warning("approval %s was not remembered: %s", decided.approval_id, exc)
            raise PageError(
                503,
                "Approved, not remembered",
                "Your approval was recorded, but it could not be remembered now; later "
                "identical calls are reviewed as before.",
                approval_id=decided.approval_id,
            ) from None
        log.info(
            "approval remembered",
            extra={"approval_id": decided.approval_id, "remember_id": kept.remember_id},
        )

    async def _person_of(self, who: str) -> str | None:
        """The key of the person `who` stands for; None when it cannot be told now (their
        other handles are then not trusted to be theirs)."""
        try:
            return (await self.people.person(who)).key
        except IdentityUnavailable:
            return None

    def _destructive(self, record: ApprovalRecord) -> bool:
        """Whether an approve asks to confirm first: the tool says it changes things that may
        not be undone, or it is not this bot's, so nothing is known of it (as in Slack)."""
        tool = record.request.tool
        return tool not in self.registry or self.registry.get(tool).effects == "destructive"

    async def _result(self, record: ApprovalRecord) -> dict[str, str] | None:
        """What the call's tool answered, from its run's messages (as `GET /runs/{id}` has
        it); None when the store keeps no such run (an app that runs its own tools) or
        cannot be read now: the page then shows the outcome alone."""
        if not isinstance(self.store, RunStore):
            return None
        try:
            run = await self.store.get_run(record.request.run_id)
        except (RunNotFound, StoreError):
            return None
        answers = [
            message
            for message in run.messages
            if isinstance(message, ToolMessage) and message.tool_call_id == record.request.call_id
        ]
        if not answers:
            return None
        message = answers[-1]
        try:
            content = json.loads(message.content)
        except ValueError:
            content = message.content
        if isinstance(content, dict) and len(content) == 1 and {"result", "error"} & set(content):
            content = next(iter(content.values()))
        return {"status": message.status, "text": shown(content)}

    def _span(self, moment: datetime | None, past: bool = True) -> dict[str, Any]:
        """`moment` as the templates say it: its exact time, and how long from the inbox's
        clock (`count` of `unit`, none under a minute), so that tests may move time. A
        moment said to be `past` (made by another clock, a little ahead) is never future."""
        if moment is None:
            return {"iso": "", "count": 0, "unit": None, "future": False}
        seconds = (moment - _moment(self._clock())).total_seconds()
        if past:
            seconds = min(seconds, 0.0)
        span = abs(seconds)
        count, unit = 0, None
        for size, name, limit in ((60, "min", 60), (3600, "h", 48), (86400, "d", None)):
            count = round(span / size)
            if limit is None or count < limit:
                unit = name if span >= 45 else None
                break
        return {
            "iso": moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "count": count,
            "unit": unit,
            "future": seconds > 0,
        }

    def _fields(self, record: ApprovalRecord) -> list[EditField]:
        """The edit form's inputs: from the tool's model, or for a tool this bot does not
        have from the schema its caller sent (`policy["schema"]`); none without either."""
        tool = record.request.tool
        if tool in self.registry:
            if tool not in self._schemas:  # built once per tool: a schema is not cheap to make
                self._schemas[tool] = self.registry.get(tool).model.model_json_schema()
            schema = self._schemas[tool]
        else:
            sent = record.request.policy.get("schema")
            if not isinstance(sent, dict):
                return []
            schema = _sent_schema(sent)
        editable = record.request.policy.get("editable")
        return edit_fields(schema, record.request.arguments, editable)

    async def _actions(
        self, who: str, record: ApprovalRecord
    ) -> tuple[str | None, dict[Action, str | None]]:
        """The person `who` stands for, and each action with why the policy refuses it to
        them (None: allowed); `respond` only where the rule lists it (elsewhere it is no
        action to offer, nor to say is closed). A question has two: `respond` (answer it)
        and `deny` (decline it); approve and edit are no actions of it."""
        deny = await self.authorize(who, record, Decision(approved=False))
        if is_question(record.request):
            answer = Decision(approved=False, response=RESPOND_PROBE)
            answered = await self.authorize(who, record, answer)
            return deny.person, {"respond": answered.refusal, "deny": deny.refusal}
        approve = await self.authorize(who, record, Decision(approved=True))
        found: dict[Action, str | None] = {"approve": approve.refusal, "deny": deny.refusal}
        if "respond" in (record.request.policy.get("allowed_decisions") or []):
            answer = Decision(approved=False, response=RESPOND_PROBE)
            found["respond"] = (await self.authorize(who, record, answer)).refusal
        fields = self._fields(record)
        if record.request.approvals_required > 1:
            found["edit"] = "a review that needs several approvals cannot be edited"
        elif not fields:
            found["edit"] = "none of this call's arguments may be edited here"
        else:
            probe = {fields[0].name: record.request.arguments.get(fields[0].name)}
            edit = await self.authorize(who, record, Decision(approved=True, edited_args=probe))
            found["edit"] = edit.refusal
        return approve.person, found

    async def _involved(self, who: str, record: ApprovalRecord) -> bool:
        """Whether `who` decided `record` or was among those who might have."""
        decided_by = record.decision.decided_by if record.decision else None
        if decided_by and who.lower() in (name.lower() for name in decided_by.split(", ")):
            return True
        _, actions = await self._actions(who, record)
        return any(reason is None for reason in actions.values())

    async def _may_decide(self, who: str, record: ApprovalRecord) -> bool:
        """Whether the pending `record` is on `who`'s list: its rule leaves them a decision."""
        _, actions = await self._actions(who, record)
        return any(reason is None for reason in actions.values())

    async def _pending_row(self, who: str, record: ApprovalRecord) -> dict[str, Any]:
        """A pending review as the list shows it: its votes so far, whether `who` has voted,
        and whether it may be selected (approved or denied by `who` in one act)."""
        person, actions = await self._actions(who, record)
        votes = await self._votes(record)
        voted = any(_is_voter(e, who, person) for e in votes)
        # A question is answered on its own page: never selected (approved or denied) here.
        selectable = not is_question(record.request) and None in (
            actions.get("approve", ""),
            actions.get("deny", ""),
        )
        return {
            "record": record,
            "votes": [_voter(e) for e in votes],
            "voted": voted,
            "selectable": not voted and selectable,
        }

    def _decided(self) -> None:
        """Something was decided here: the runs may go on, and the live lists change."""
        if self.service is not None:
            self.service.decided()
        self.live.wake()

    async def _seen(self, who: str, approval_id: str) -> ApprovalRecord | None:
        """The approval, when there is one and `who` may see it; else None."""
        try:
            record = await self.store.get(approval_id)
        except ApprovalNotFound:
            return None
        return record if await self._may_see(who, record) else None

    async def _act_outcome(
        self, who: str, person: str | None, act: str, approval_id: str
    ) -> dict[str, Any]:
        """What the act `act` of `who` did to one review, from its events: `status` decided,
        voted (waiting for more approvals), refused (with the `reason`), already_decided
        (`by` whom), already_voted, not_recorded (the decision was not accepted), question
        (a question, which is answered on its own page: nothing was recorded), or not_found
        (no approval `who` may see has the id)."""
        record = await self._seen(who, approval_id)
        found: dict[str, Any] = {"approval_id": approval_id, "record": record}
        if record is None:
            return {**found, "status": "not_found"}
        if is_question(record.request):
            return {**found, "status": "question"}
        events = await self.store.events(approval_id)
        ours = [e for e in events if _of_act(e, act) and _is_voter(e, who, person)]
        kinds = {event.kind for event in ours}
        decided_by = record.decision.decided_by if record.decision is not None else None
        if "decided" in kinds or ("voted" in kinds and record.decision is not None):
            return {**found, "status": "decided"}
        if "voted" in kinds:
            return {**found, "status": "voted"}
        refused = [e for e in ours if e.kind == "refused"]
        if refused and refused[-1].detail.get("reason") != "already decided":
            return {**found, "status": "refused", "reason": refused[-1].detail.get("reason")}
        if record.decision is not None:
            return {**found, "status": "already_decided", "by": decided_by}
        if any(e.kind == "voted" and _is_voter(e, who, person) for e in events):
            return {**found, "status": "already_voted"}
        return {**found, "status": "not_recorded"}

    async def _votes(self, record: ApprovalRecord) -> list[ApprovalEvent]:
        if record.request.approvals_required <= 1:
            return []
        events = await self.store.events(record.approval_id)
        return [e for e in events if e.kind == "voted"]

    async def _refuse(
        self,
        record: ApprovalRecord,
        who: str,
        person: str | None,
        reason: str,
        evidence: dict[str, Any],
    ) -> None:
        """Record the refused attempt, then raise the page that says why."""
        METRICS.refused(CHANNEL, reason)
        await self.store.refuse(
            record.approval_id,
            actor=who,
            channel=CHANNEL,
            reason=reason,
            person=person,
            evidence=evidence,
        )
        raise _refused(record, reason)

    async def _visible(self, who: str, approval_id: str) -> ApprovalRecord:
        """The approval, when `who` may see it. Raises `PageError` 404 when there is no such
        approval, and the same when there is one that `who` may not see."""
        try:
            record = await self.store.get(approval_id)
        except ApprovalNotFound:
            raise _not_found(approval_id) from None
        if not await self._may_see(who, record):
            log.info("%s may not see approval %s: answered as unknown", who, approval_id)
            raise _not_found(approval_id)
        return record

    async def _may_see(self, who: str, record: ApprovalRecord) -> bool:
        """Whether `who` may see `record`: one of its reviewers as the authorizer has them
        (escalation, user groups and channels included; anyone when the rule names none),
        its requester, or someone who voted on it or decided it. A check that cannot be
        made (Slack failing) does not show it."""
        person: str | None = None
        for probe in (Decision(approved=False), Decision(approved=True)):
            verdict = await self.authorize(who, record, probe)
            person = person or verdict.person
            # Refused only by the rule (the same for everyone) or as the requester: still
            # one of those who see it.
            if verdict.refusal in (None, rule_refusal(record, probe), SELF_APPROVAL_REASON):
                return True
        requester = record.request.requested_by
        try:
            if requester is not None and await self.people.same(requester, who):
                return True
        except IdentityUnavailable:
            pass
        handle = who.lower()
        for event in await self.store.events(record.approval_id):
            if event.kind not in ("voted", "decided"):
                continue
            same = person is not None and event.person == person
            if same or (event.actor or "").lower() == handle:
                return True
        return False

    async def _session(self, request: Request) -> Session:
        """The request's session, once it is signed, unexpired and not ended in the store
        (one query). Raises `PageError`: 401 to sign in again, 503 when the store cannot
        tell (a session not checked is not trusted)."""
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            raise PageError(401, "Please sign in", f"This page is for reviewers. {HOW_TO_SIGN_IN}")
        try:
            session = self.signer.session(cookie)
        except TokenError as exc:
            what = "Your session has ended." if exc.reason == "expired" else "You are signed out."
            raise PageError(401, "Please sign in", f"{what} {HOW_TO_SIGN_IN}") from None
        issued = None if session.issued_at is None else _moment(session.issued_at)
        if await self._revoked(session.session_id, session.principal, issued):
            raise PageError(401, "Please sign in", f"This session was ended. {HOW_TO_SIGN_IN}")
        request.state.session = session  # for its error pages, without a second check
        return session

    async def _current_session(self, request: Request) -> Session | None:
        """The request's session when it has a live one, else None. Raises `PageError` 503
        when the store cannot tell."""
        cookie = request.cookies.get(COOKIE)
        if not cookie:
            return None
        try:
            session = self.signer.session(cookie)
        except TokenError:
            return None
        issued = None if session.issued_at is None else _moment(session.issued_at)
        if await self._revoked(session.session_id, session.principal, issued):
            return None
        return session

    async def _review_link(self, token: str) -> ReviewLink:
        """The review link of `token`, once it is signed, unexpired and its reviewer's
        sessions were not ended after it was made. Raises `PageError`."""
        try:
            link = self.signer.review_of(token)
        except TokenError as exc:
            what = (
                "This review link has expired: the review is closed to email, or it was "
                "sent too long ago."
                if exc.reason == "expired"
                else "This review link is not valid: it was changed, cut short, or made with "
                "another secret."
            )
            raise PageError(
                403, "Review link not accepted", f"{what} Nothing was recorded. {HOW_TO_SIGN_IN}"
            ) from None
        # A link has no session of its own to end: only its reviewer's revocations apply,
        # which end every link sent before them.
        link_id = "review:" + hashlib.sha256(token.encode()).hexdigest()[:32]
        if await self._revoked(link_id, link.principal, _moment(link.issued_at)):
            raise PageError(
                403,
                "Review link not accepted",
                f"The sessions of {link.principal} were ended after this link was sent, so it "
                f"signs nobody in. Nothing was recorded. {HOW_TO_SIGN_IN}",
            )
        return link

    async def _revoked(self, session_id: str, principal: str, issued: datetime | None) -> bool:
        """Whether the store has the session ended. Raises `PageError` 503 when it cannot
        tell (a session not checked is not trusted)."""
        try:
            return await self.sessions.session_revoked(session_id, principal, issued)
        except StoreError as exc:
            log.warning("sessions cannot be checked, so none is trusted: %s", exc)
            raise PageError(
                503,
                "Inbox unavailable",
                "The inbox cannot check your session now (the approval store cannot be "
                "used), so it shows nothing and records nothing. Try again shortly.",
            ) from None

    def _set_cookie(self, response: Response, cookie: str, ttl: int) -> None:
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=ttl,
            path="/inbox",
            secure=self.secure,
            httponly=True,
            samesite="lax",
        )

    def _check_csrf(self, session: Session, form: Mapping[str, str]) -> None:
        if not self.signer.check_csrf(session, form.get("csrf")):
            raise PageError(
                403,
                "Form not accepted",
                "This form did not come from your inbox page, or from an earlier session; "
                "nothing was recorded. Open the approval again and decide from there.",
            )

    def _render(
        self, template: str, status: int, session: Session | None, **context: Any
    ) -> HTMLResponse:
        nonce = secrets.token_urlsafe(16)  # the page's own scripts, this response only
        page = self.templates.get_template(template).render(
            principal=session.principal if session else None,
            only=session.only if session else None,
            csrf=self.signer.csrf(session) if session else "",
            nonce=nonce,
            **context,
        )
        response = HTMLResponse(page, status_code=status)
        connect = _SCRIPTED.get(template)
        if connect is not None:
            response.headers["Content-Security-Policy"] = _csp(nonce, connect)
        return response

    def _page(self, handler: Handler) -> Handler:
        """`handler` answering every failure with an error page, and every page with the
        headers that keep it out of other sites' frames and caches."""

        async def page(request: Request) -> Response:
            try:
                response = await handler(request)
            except PageError as exc:
                response = self._error(request, exc)
            except StoreError as exc:
                log.warning("the store cannot be used: %s", exc)
                response = self._error(
                    request,
                    PageError(
                        503,
                        "Try again shortly",
                        "The approval store cannot be used now; nothing was recorded.",
                    ),
                )
            except Exception as exc:
                # Logged in full here; the reviewer learns only that it was not their fault.
                log.error(
                    "unexpected error on %s %s", request.method, request.url.path, exc_info=exc
                )
                response = self._error(
                    request,
                    PageError(
                        500,
                        "Something went wrong",
                        "The bot failed to answer; it is logged. Nothing was recorded.",
                    ),
                )
            for name, value in _HEADERS.items():
                response.headers.setdefault(name, value)  # a page's own CSP stays
            return response

        return page

    def _error(self, request: Request, exc: PageError) -> Response:
        # Only a session checked in this request is shown as signed in.
        session: Session | None = getattr(request.state, "session", None)
        if exc.status == 401:
            session = None
        response = self._render(
            "message.html",
            exc.status,
            session,
            title=exc.title,
            message=exc.message,
            approval_id=exc.approval_id,
        )
        if exc.status == 401 and request.cookies.get(COOKIE):
            response.delete_cookie(COOKIE, path="/inbox", secure=self.secure, httponly=True)
        return response


_NEW_LINK = "Ask whoever gave it to you for a new link."


def _within(session: Session, approval_id: str | None) -> None:
    """Refuse a session limited to one approval (a review link's) anything else: the inbox's
    list (`approval_id` None) or another approval, whether it exists or not. Raises
    `PageError` 403."""
    if session.only is None or session.only == approval_id:
        return
    raise PageError(
        403,
        "This link is for one review",
        f"This link signs you in for review {session.only} only; ask for a sign-in link for "
        "the inbox (whoever runs nodbot makes one with nodbot inbox-link --config nodbot.yml "
        "--reviewer <your id or email address>). Nothing was recorded.",
        approval_id=session.only,
    )


def _not_found(approval_id: str) -> PageError:
    return PageError(404, "No such approval", f"No approval has the id {approval_id!r}.")


def _no_delegation(delegation_id: str) -> PageError:
    return PageError(
        404,
        "No such delegation",
        f"You have no delegation {delegation_id}: it may be another's, or a standing one of "
        "the configuration (ask whoever runs nodbot). Nothing was changed.",
    )


def _not_remembered(remember_id: str) -> PageError:
    return PageError(
        404,
        "No such remembered approval",
        f"None of your remembered approvals has the id {remember_id!r}; nothing was forgotten.",
    )


def _made_by(kept: RememberedApproval, who: str, person: str | None) -> bool:
    """Whether `who` (the person `person`, when known) made the remembered approval."""
    return kept.decided_by.lower() == who.lower() or (person is not None and kept.person == person)


def _sent_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A caller's schema of the arguments with only what the edit form can read: property
    and definition nodes that are objects, and variants (`anyOf`, `oneOf`) that are lists
    of objects. It came with the request, from the agent's side, and is not trusted."""

    def usable(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        return all(
            isinstance(node.get(key, []), list)
            and all(isinstance(item, dict) for item in node.get(key, []))
            for key in ("anyOf", "oneOf")
        )

    properties = schema.get("properties")
    defs = schema.get("$defs")
    return {
        "properties": {
            str(name): node
            for name, node in (properties.items() if isinstance(properties, dict) else ())
            if usable(node)
        },
        "$defs": {
            str(name): node
            for name, node in (defs.items() if isinstance(defs, dict) else ())
            if usable(node)
        },
    }


def _already_decided(approval_id: str, decided_by: str | None) -> PageError:
    first = f" by {decided_by}" if decided_by else ""
    return PageError(
        409,
        "Already decided",
        f"This approval was already decided{first}: the first decision counts, and yours was "
        "not recorded.",
        approval_id=approval_id,
    )


def _already_answered(record: ApprovalRecord) -> PageError:
    """The page of an answer to a question that was answered (declined, timed out) first."""
    view = question_view(record)
    state = view.state if view is not None else "answered"
    decided_by = record.decision.decided_by if record.decision is not None else None
    if state == "timed out":
        what = "This question already timed out: nobody answered before its deadline"
    else:
        what = f"This question was already {state}" + (f" by {decided_by}" if decided_by else "")
    return PageError(
        409,
        f"Already {state}",
        f"{what}. The first answer counts, and yours was not recorded.",
        approval_id=record.approval_id,
    )


def _already_voted(approval_id: str) -> PageError:
    return PageError(
        409,
        "Already voted",
        "You have voted on this approval already; it waits for the other reviewers.",
        approval_id=approval_id,
    )


def _refused(record: ApprovalRecord, reason: str) -> PageError:
    return PageError(
        403,
        "Not allowed",
        f"The rule of this call refuses your decision: {reason}. Nothing was recorded.",
        approval_id=record.approval_id,
    )


async def _form(request: Request) -> dict[str, str]:
    """The form-encoded body: each name's first value. Raises `PageError`."""
    return _first_values(await _form_pairs(request))


def _first_values(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Each name's first value."""
    form: dict[str, str] = {}
    for name, value in pairs:
        form.setdefault(name, value)
    return form


async def _form_pairs(request: Request) -> list[tuple[str, str]]:
    """The form-encoded body, every name and value in order (a list's checkboxes share a
    name). Raises `PageError`."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise PageError(415, "Not a form", "Expected a form (application/x-www-form-urlencoded).")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise PageError(
                413, "Form too large", "The form is larger than 1 MB; nothing was recorded."
            )
    try:
        text = body.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=1000, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise PageError(400, "Unreadable form", "The form is not valid UTF-8 form data.") from None
    return pairs


_ACT = re.compile(r"[0-9a-f]{16}")
"""An act of the list's selection, as its results' address names it."""


def _selection_problem(ids: list[str]) -> str | None:
    """What keeps the ids selected in the list from being decided (None: nothing)."""
    if not ids:
        return "No review was selected: tick the reviews to decide first"
    for approval_id in ids:
        if len(approval_id) > MAX_ID:
            return f"{approval_id[:40]!r}… is not an approval id"
    problem = bulk_problem(ids)
    if problem is None:
        return None
    return f"{problem[0].upper()}{problem[1:]}"


def _of_act(event: ApprovalEvent, act: str) -> bool:
    """Whether `event` was recorded by the list's act `act` (its evidence says so)."""
    evidence = event.detail.get("evidence")
    return isinstance(evidence, dict) and evidence.get("act") == act


def _revocations_of(store: ApprovalStore) -> SessionRevocations:
    """The store's `sessions`. Raises `TypeError` for a store without them: an inbox that
    could not end a session is not served."""
    sessions = getattr(store, "sessions", None)
    if not isinstance(sessions, SessionRevocations):
        raise TypeError(
            "the web inbox needs a store that keeps ended sessions (a `sessions` attribute, "
            f"see core.store.SessionRevocations); {type(store).__name__} has none"
        )
    return sessions


def _moment(seconds: float) -> datetime:
    """Unix seconds as a UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC)


def _short(identifier: str) -> str:
    """An id as the list shows it: its kind and its random end (`run_…9f3a0c21`), which tell
    two of them apart; its start is the time it was made."""
    if len(identifier) <= 14:
        return identifier
    kind, _, _ = identifier.partition("_")
    prefix = f"{kind}_" if len(kind) <= 5 else ""
    return f"{prefix}…{identifier[-8:]}"


def _edits(record: ApprovalRecord) -> list[dict[str, Any]]:
    """The reviewer's changes, each with the value it replaced."""
    original = record.request.arguments
    return [
        {"name": name, "old": original.get(name), "new": value}
        for name, value in (_edited(record) or {}).items()
    ]


def _is_voter(event: ApprovalEvent, who: str, person: str | None) -> bool:
    """Whether `event` is a vote of `who` (under any of their handles, when known)."""
    return (event.actor or "").lower() == who.lower() or (
        person is not None and event.person == person
    )


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _voter(event: ApprovalEvent, names: Mapping[str, str] | None = None) -> str:
    """Who cast a vote: the person's name or address when the event tells it (or `names`
    does, by handle), else the handle they voted with."""
    name = name_of_person(event.person) or (names or {}).get((event.actor or "").lower())
    return name or event.actor or event.person or "someone"


def _session_ref(session: Session) -> str:
    """The session, as recorded in the audit trail: a digest, not the id itself."""
    return hashlib.sha256(session.session_id.encode()).hexdigest()[:16]


def _edited(record: ApprovalRecord) -> dict[str, Any] | None:
    return record.decision.edited_args if record.decision is not None else None


def _event(
    event: ApprovalEvent, names: Mapping[str, str] | None = None, *, question: str | None = None
) -> EventView:
    """One line of the review's history: people by name, the bot as nodbot, digests and
    evidence kept for the disclosure, a question's decision as answered or declined
    (`bot.web.history`)."""
    return event_view(event, names, question=question)
