"""A small typed client of the bot's approval request API, for agents that run their tools
themselves (in another process, framework or language: this is the Python one).

```python
async with ApprovalClient("http://127.0.0.1:8080", token=os.environ["NODBOT_TOKEN"]) as nodbot:
    asked = await nodbot.request("refund", {"order_id": "o-7", "amount": 500},
                                 run_id="thread-42", call_id="call_1")
    decided = await nodbot.wait(asked.approval_id, within=3600)
    answer = await nodbot.consume(decided)   # once: a second one is refused
    if answer.approved:
        refund(**answer.arguments)                        # the arguments the reviewer saw or set
```

`consume` checks the one-use token it is handed (`core.approval_tokens`) against the call it
asked about, so a decision for another call, or one changed on the way, is refused here too.
`SyncApprovalClient` is the same over `httpx.Client`. Errors are `ApprovalClientError` with
the HTTP status and the bot's message; a decision handed out already is
`DecisionAlreadyTaken`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from nodbot.core.approval_tokens import ApprovalToken, token_key
from nodbot.core.errors import NodbotError

__all__ = [
    "Approval",
    "ApprovalClient",
    "ApprovalClientError",
    "Consumed",
    "DecisionAlreadyTaken",
    "DecisionTimeout",
    "SyncApprovalClient",
]

MAX_WAIT = 60.0
"""The longest wait one request asks of the bot; longer waits ask again."""


class ApprovalClientError(NodbotError):
    """The bot refused a request or could not be reached; `status` is the HTTP status (0 when
    there was no answer)."""

    def __init__(self, message: str, *, status: int = 0, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self._details = details or {}

    def details(self) -> dict[str, Any]:
        return {"status": self.status, **self._details}


class DecisionAlreadyTaken(ApprovalClientError):
    """The decision was handed out already: it answers one call, once."""


class DecisionTimeout(ApprovalClientError):
    """Nobody decided within the time the caller would wait."""


@dataclass(frozen=True)
class Approval:
    """An approval as the bot shows it."""

    approval_id: str
    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    status: str
    """`pending`, `approved` or `denied`."""
    decided_by: str | None
    reason: str | None
    consumed: bool

    @property
    def decided(self) -> bool:
        return self.status != "pending"

    @classmethod
    def of(cls, body: dict[str, Any]) -> Approval:
        decision = body.get("decision") or {}
        return cls(
            approval_id=body["approval_id"],
            run_id=body["run_id"],
            call_id=body["call_id"],
            tool=body["tool"],
            arguments=body["arguments"],
            status=body["status"],
            decided_by=decision.get("decided_by"),
            reason=decision.get("reason"),
            consumed=bool(body.get("consumed")),
        )


@dataclass(frozen=True)
class Consumed:
    """A decision, handed out once, with its checked one-use token."""

    approval_id: str
    approved: bool
    arguments: dict[str, Any]
    """The arguments to run the call with (a reviewer's edits merged in)."""
    edited: bool
    reason: str | None
    decided_by: str | None
    token: str
    """The one-use approval token's text."""
    claims: ApprovalToken
    """What the token says, verified."""


def _request_body(
    tool: str,
    arguments: dict[str, Any],
    run_id: str,
    call_id: str,
    schema: dict[str, Any] | None,
    requested_by: str | None,
    description: str | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tool": tool,
        "arguments": arguments,
        "run_id": run_id,
        "call_id": call_id,
    }
    for key, value in (
        ("schema", schema),
        ("requested_by", requested_by),
        ("description", description),
    ):
        if value is not None:
            body[key] = value
    return body


def _answer(response: httpx.Response, *, taking: bool = False) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        message = message or f"the bot answered {response.status_code}"
        details = body.get("details") if isinstance(body, dict) else None
        kind = DecisionAlreadyTaken if taking and "handed out already" in message else None
        raise (kind or ApprovalClientError)(
            message, status=response.status_code, details=details or {}
        )
    if not isinstance(body, dict):
        raise ApprovalClientError(
            "the bot's answer is not a JSON object", status=response.status_code
        )
    return body


def _consumed(body: dict[str, Any], key: bytes, asked: Approval) -> Consumed:
    claims = ApprovalToken.verify(str(body["token"]), key)
    claims.check(
        run_id=asked.run_id,
        call_id=asked.call_id,
        tool=asked.tool,
        arguments=asked.arguments,
        final=body["arguments"],
    )
    return Consumed(
        approval_id=body["approval_id"],
        approved=bool(body["approved"]),
        arguments=body["arguments"],
        edited=bool(body["edited"]),
        reason=body.get("reason"),
        decided_by=body.get("decided_by"),
        token=str(body["token"]),
        claims=claims,
    )


class ApprovalClient:
    """The approval request API over `httpx.AsyncClient` (see the module)."""

    def __init__(self, base_url: str, *, token: str, timeout: float = 30.0) -> None:
        self._key = token_key(token)
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout + MAX_WAIT,
        )

    async def __aenter__(self) -> ApprovalClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        run_id: str,
        call_id: str,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
    ) -> Approval:
        """Put the call to the bot's rules: decided at once, or a review opened (asking again
        for the same call gives the same approval)."""
        body = _request_body(tool, arguments, run_id, call_id, schema, requested_by, description)
        return Approval.of(_answer(await self._send("POST", "/approvals", json=body)))

    async def get(self, approval_id: str, *, wait: float = 0) -> Approval:
        path = f"/approvals/{approval_id}"
        params = {"wait": str(min(wait, MAX_WAIT))} if wait > 0 else None
        return Approval.of(_answer(await self._send("GET", path, params=params)))

    async def wait(self, approval_id: str, *, within: float) -> Approval:
        """The approval once decided; raises `DecisionTimeout` after `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            found = await self.get(approval_id, wait=max(0.0, left))
            if found.decided:
                return found
            if deadline - time.monotonic() <= 0:
                raise DecisionTimeout(
                    f"nobody decided {approval_id} within {within:g} s",
                    details={"approval_id": approval_id},
                )

    async def consume(self, approval: Approval) -> Consumed:
        """Take the decision of `approval` (as `request` or `wait` gave it), once, and check
        its token against that call."""
        path = f"/approvals/{approval.approval_id}/consume"
        return _consumed(_answer(await self._send("POST", path), taking=True), self._key, approval)

    async def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise ApprovalClientError(f"the bot could not be reached: {exc}") from exc


class SyncApprovalClient:
    """The approval request API over `httpx.Client`: the same calls, blocking."""

    def __init__(self, base_url: str, *, token: str, timeout: float = 30.0) -> None:
        self._key = token_key(token)
        self._http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout + MAX_WAIT,
        )

    def __enter__(self) -> SyncApprovalClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        run_id: str,
        call_id: str,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
    ) -> Approval:
        body = _request_body(tool, arguments, run_id, call_id, schema, requested_by, description)
        return Approval.of(_answer(self._send("POST", "/approvals", json=body)))

    def get(self, approval_id: str, *, wait: float = 0) -> Approval:
        path = f"/approvals/{approval_id}"
        params = {"wait": str(min(wait, MAX_WAIT))} if wait > 0 else None
        return Approval.of(_answer(self._send("GET", path, params=params)))

    def wait(self, approval_id: str, *, within: float) -> Approval:
        deadline = time.monotonic() + within
        while True:
            found = self.get(approval_id, wait=max(0.0, deadline - time.monotonic()))
            if found.decided:
                return found
            if deadline - time.monotonic() <= 0:
                raise DecisionTimeout(
                    f"nobody decided {approval_id} within {within:g} s",
                    details={"approval_id": approval_id},
                )

    def consume(self, approval: Approval) -> Consumed:
        path = f"/approvals/{approval.approval_id}/consume"
        return _consumed(_answer(self._send("POST", path), taking=True), self._key, approval)

    def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise ApprovalClientError(f"the bot could not be reached: {exc}") from exc
