"""One-use approval tokens: what `POST /approvals/{id}/consume` hands out with a decision, and
the only form in which a bridge passes an approval to an agent framework.

A token names one decision and binds it to the call it answers: the run id, the framework's
native call id, the tool and the SHA-256 digest of the call's original arguments
(`arguments_digest`), with the decision itself (approved or not, the final arguments' digest
when a reviewer edited them, the reason, and for a respond the reviewer's answer given in the
tool's place). It is `nat1.<claims>.<mac>`: the claims as
base64url canonical JSON, and HMAC-SHA256 over them keyed by a key derived from the API
bearer token that consumed the decision. The bot and the holder of that bearer token can
both compute the key, so a client checks a token it was handed without any other secret,
and a token made up or changed by someone without the bearer token does not verify.

It is one-use because the decision behind it is: the bot hands it out once (a second consume
is refused), and `check` refuses it for any call but the one it names (another run, call id,
tool or argument digest, such as a thread that moved on to other arguments).

The client acts only on the signed claims. The rest of the consume answer (`approved`,
`arguments`, `edited`, `reason`, `decided_by`) is a copy for readers: `core.client` takes the
decision from the verified claims, binds the arguments it runs with to their digests
(`edited_digest` when a reviewer edited them, else `digest`) and refuses an answer whose copy
says anything else (`core.client.UntrustedDecision`), so a proxy or a bug that rewrites the
answer on its way makes nothing run. The key is shared through the bearer token, so the
signature holds against whoever has not seen that token; whoever has (a hop that reads the
requests' `Authorization` header, such as plain http or a proxy ending TLS) can sign claims
of their own, as they can act as the agent: let TLS end at the bot, or at a proxy trusted as
the bot is.
A caller that runs the call through a nodbot `Executor` of its own passes the token as
`ToolContext.approval`, wrapped with its key and the arguments the decision allows
(`TokenApproval`): the executor verifies it, checks it against that very call (run, call id,
tool, the digest of the call's arguments as given), runs the call at most once on it, and
refuses it for any other call with `ApprovalMismatchError`.

A respond (a reviewer's answer in the tool's place, `Decision.response`) is a denial whose
claims carry the answer as `response`, covered by the signature like every claim: the
executor's decision for the call is then `Decision(approved=False, response=...)`, so
`executor.run` returns the answer and the tool does not run. A claim `response` is left out
of the claims when None, so the tokens of every other decision are signed over the same
claims as before it existed (and a client that predates it still reads them).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from nodbot.core.decisions import Decision
from nodbot.core.errors import NodbotError
from nodbot.core.tools import arguments_digest, canonical_json

__all__ = ["ApprovalToken", "InvalidApprovalToken", "TokenApproval", "token_key"]

PREFIX = "nat1"
_LABEL = b"nodbot approval token v1"


class InvalidApprovalToken(NodbotError):
    """A token that does not verify, or that names another call; the message says which."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def token_key(bearer_token: str) -> bytes:
    """The key the tokens handed to the holder of `bearer_token` are signed with."""
    return hmac.new(bearer_token.encode(), _LABEL, hashlib.sha256).digest()


@dataclass(frozen=True)
class ApprovalToken:
    """The claims of a token (see the module)."""

    approval_id: str
    run_id: str
    call_id: str
    tool: str
    digest: str
    """SHA-256 of the call's original arguments."""
    approved: bool
    decided_by: str | None = None
    reason: str | None = None
    edited_digest: str | None = None
    """SHA-256 of the final arguments when a reviewer edited them, else None."""
    response: str | None = None
    """A respond's answer, given to the model in the tool's place (`Decision.response`;
    only with `approved` false); None for every other decision, and then not in the claims."""

    def sign(self, key: bytes) -> str:
        """The token's text, signed with `key` (`token_key`)."""
        claims = asdict(self)
        if claims["response"] is None:
            del claims["response"]  # the claims of every other decision, as they always were
        payload = _b64(canonical_json(claims).encode())
        return f"{PREFIX}.{payload}.{_b64(_mac(key, payload))}"

    @classmethod
    def verify(cls, text: str, key: bytes) -> ApprovalToken:
        """The claims of `text`, whose signature must hold under `key`. Raises
        `InvalidApprovalToken`."""
        prefix, _, rest = text.partition(".")
        payload, _, mac = rest.partition(".")
        if prefix != PREFIX or not payload or not mac:
            raise InvalidApprovalToken("not an approval token of nodbot")
        try:
            given = _unb64(mac)
        except (binascii.Error, ValueError):
            raise InvalidApprovalToken("the approval token's signature is malformed") from None
        if not hmac.compare_digest(given, _mac(key, payload)):
            raise InvalidApprovalToken("the approval token was not issued to this client")
        try:
            claims = cls(**json.loads(_unb64(payload)))
        except (binascii.Error, ValueError, TypeError):
            raise InvalidApprovalToken("the approval token's claims are malformed") from None
        if claims.response is not None and (
            not isinstance(claims.response, str) or claims.approved is not False
        ):
            raise InvalidApprovalToken(
                "the approval token's claims are malformed: a response goes with a denial only"
            )
        return claims

    def check(
        self,
        *,
        run_id: str,
        call_id: str | None,
        tool: str,
        arguments: Mapping[str, Any],
        final: Mapping[str, Any] | None = None,
    ) -> None:
        """Refuse (`InvalidApprovalToken`) unless the token answers this very call: the
        same run, native call id, tool and original arguments, and, when `final` (the
        arguments about to run) is given, those the decision allows."""
        if not call_id:
            raise InvalidApprovalToken("the call has no native call id, so no token answers it")
        for name, mine, theirs in (
            ("run", self.run_id, run_id),
            ("call id", self.call_id, call_id),
            ("tool", self.tool, tool),
        ):
            if mine != theirs:
                raise InvalidApprovalToken(
                    f"the approval token is for {name} {mine!r}, not {theirs!r}"
                )
        if self.digest != arguments_digest(arguments):
            raise InvalidApprovalToken(
                "the approval token was issued for other arguments: the call changed since "
                "it was reviewed"
            )
        if final is not None:
            allowed = self.edited_digest or self.digest
            if arguments_digest(final) != allowed:
                raise InvalidApprovalToken("the arguments to run are not the ones decided")


@dataclass(frozen=True)
class TokenApproval:
    """An adapter-issued one-use approval token, as a caller sets it on `ToolContext.approval`
    to run the call it answers through an `Executor`: the token as handed out (`token`, from
    `POST /approvals/{id}/consume`, `core.client.Consumed.token`), the key it verifies under
    (`token_key` of the bearer token that consumed it) and the arguments the decision allows
    (`Consumed.arguments`: needed when a reviewer edited them; None: the call's own).

    ```python
    answer = await nodbot.consume(decided)
    approval = TokenApproval(answer.token, key=token_key(bearer), arguments=answer.arguments)
    ctx = executor.context(run_id="thread-42", approval=approval)
    await executor.run(ToolCall(name="refund", arguments=asked, id="call_1"), ctx)
    ```
    """

    token: str
    """The token's text, `nat1.<claims>.<mac>`."""
    key: bytes = field(repr=False)
    """The key the token verifies under: `token_key(bearer_token)`."""
    arguments: Mapping[str, Any] | None = None
    """The arguments to run the call with, as the decision allows them (a reviewer's edit
    merged in); None: the call's own arguments."""

    def decision_for(
        self, *, run_id: str, call_id: str, tool: str, arguments: Mapping[str, Any]
    ) -> tuple[ApprovalToken, Decision]:
        """The token's claims and its decision for the call of `tool` with `arguments` (as
        given) that run `run_id` made as `call_id`, once the token verifies and answers
        that very call, with arguments its claims allow: a respond's decision carries the
        signed `response` (the tool does not run; its answer is the call's result). Raises
        `InvalidApprovalToken` otherwise, naming what does not match."""
        claims = ApprovalToken.verify(self.token, self.key)
        final = dict(arguments) if self.arguments is None else dict(self.arguments)
        claims.check(run_id=run_id, call_id=call_id, tool=tool, arguments=arguments, final=final)
        if claims.response is not None:
            return claims, _respond(claims)
        if not claims.approved:
            return claims, Decision(
                approved=False, reason=claims.reason, decided_by=claims.decided_by
            )
        edited = final if claims.edited_digest is not None else None
        decision = Decision(
            approved=True, edited_args=edited, reason=claims.reason, decided_by=claims.decided_by
        )
        return claims, decision


def _respond(claims: ApprovalToken) -> Decision:
    """The respond of `claims` (whose `response` is set); `InvalidApprovalToken` when its
    answer could not be given (blank, or longer than `MAX_RESPONSE`), as the bot never signs
    such an answer."""
    try:
        return Decision(
            approved=False,
            response=claims.response,
            reason=claims.reason,
            decided_by=claims.decided_by,
        )
    except ValidationError:
        raise InvalidApprovalToken(
            "the approval token's claims are malformed: its response cannot be given"
        ) from None


def _mac(key: bytes, payload: str) -> bytes:
    return hmac.new(key, f"{PREFIX}.{payload}".encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
