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
the HTTP status and the bot's message (a wrong token is a 401, an unreachable bot status 0);
a decision handed out already is `DecisionAlreadyTaken`.

## Guarding a function

`guard` does the three steps for you: each call of the guarded function asks the bot, waits
for the decision, takes it once and runs the function with the arguments the reviewer saw or
edited; a denial raises `CallDenied` with the reviewer's reason, and a wait past `within`
raises `DecisionTimeout` (nothing ran in either case).

```python
@nodbot.guard(run_id="thread-42", within=600)   # ApprovalClient: an async function
async def refund(order_id: str, amount: float) -> str:
    ...

@sync_nodbot.guard("refund", run_id="thread-42", within=600)   # SyncApprovalClient: a sync one
def refund(order_id: str, amount: float) -> str:
    ...

try:
    done = await refund("o-7", amount=500)  # runs once approved, maybe with an edited amount
except CallDenied as denied:
    print(denied.reason, denied.decided_by, denied.approval_id)
```

- The tool is the function's name unless given. The arguments are the call's bound
  arguments in keyword form, defaults filled in; each must be a JSON value (str, int, float,
  bool, None, lists and dicts with str keys) or the call raises `TypeError` before anything
  is asked. Parameters must be nameable: no positional-only ones, no `*args` or `**kwargs`.
- The schema sent with the review (the reviewer's edit form, and what the bot checks an
  edit against) is the JSON schema of a pydantic model of the signature (unknown arguments
  refused), unless `schema` is given. The call is checked against that model before it is
  asked about (`InvalidArgumentsError`), and so are the final arguments before it runs.
- The call id is `call_id` when given: a string (a guard made for one call, such as a
  framework's native call id) or a function of the JSON arguments (an idempotency key such
  as the order id). Otherwise it is derived: `<tool>-<digest>-<n>`, from the arguments'
  digest and a counter of this process: n is the lowest number (from 1) not held by another
  call with that run, tool and arguments that is in flight or took its decision (a call
  that ends before taking one, such as a timeout, gives its number back). Identical calls
  at once get reviews of their own, and a process that makes its calls again in the same
  order gives them the same ids.
- Retries. The bot keeps one approval per (run id, call id). A call retried after a
  timeout, or by a process restarted after a crash while it waited, gets the same review
  and waits on (or takes) its decision. A decision is handed out once: once taken, the same
  call id opens a new review instead of running again, so no decision runs a call twice. If
  a process crashed after taking a decision (whether or not its function had run), its retry
  is reviewed anew; the reviewer decides again, knowing the first one may have run.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, TypeAlias, TypeVar, get_type_hints

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from nodbot.core.approval_tokens import ApprovalToken, token_key
from nodbot.core.errors import ApprovalDenied, InvalidArgumentsError, NodbotError
from nodbot.core.tools import arguments_digest

__all__ = [
    "Approval",
    "ApprovalClient",
    "ApprovalClientError",
    "CallDenied",
    "CallId",
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


class CallDenied(ApprovalDenied):
    """A guarded call was denied, by a reviewer or a rule; the function did not run. `reason`
    is the reviewer's reason, `decided_by` who decided and `approval_id` the review."""

    approval_id: str

    def __init__(
        self, *, tool: str, reason: str | None, decided_by: str | None, approval_id: str
    ) -> None:
        super().__init__(tool=tool, reason=reason, approval_id=approval_id, decided_by=decided_by)


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


P = ParamSpec("P")
R = TypeVar("R")

CallId: TypeAlias = "str | Callable[[dict[str, Any]], str]"
"""A guard's call id: one string for every call, or a function of a call's JSON arguments."""

_ARGUMENTS_CONFIG = ConfigDict(
    extra="forbid", allow_inf_nan=False, validate_by_alias=True, validate_by_name=False
)


class _CallNumbers:
    """The derived call ids' counter of this process: per (run id, tool, arguments digest),
    the numbers held by calls in flight or that took their decision. A call takes the lowest
    free one; one that ends before taking its decision (a timeout) frees it again, so that
    its retry asks about the same review."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str, str], set[int]] = {}
        self._lock = threading.Lock()  # sync clients guard calls from several threads

    def take(self, key: tuple[str, str, str]) -> int:
        with self._lock:
            held = self._held.setdefault(key, set())
            number = 1
            while number in held:
                number += 1
            held.add(number)
            return number

    def free(self, key: tuple[str, str, str], number: int) -> None:
        with self._lock:
            self._held.get(key, set()).discard(number)


_NUMBERS = _CallNumbers()


@dataclass(frozen=True)
class _Call:
    """One call of a guarded function, as it is asked about."""

    request: dict[str, Any]
    """The keyword arguments of `request`."""
    number: tuple[tuple[str, str, str], int] | None
    """The derived call id's counter key and number; None for a given call id."""

    def free(self) -> None:
        if self.number is not None:
            _NUMBERS.free(*self.number)


class _Guard:
    """What the calls of one guarded function share: the tool, the signature and its model."""

    def __init__(
        self,
        function: Callable[..., Any],
        tool: str | None,
        *,
        run_id: str,
        within: float,
        call_id: CallId | None,
        schema: dict[str, Any] | None,
        requested_by: str | None,
        description: str | None,
    ) -> None:
        if within < 0:
            raise ValueError(f"within must be at least 0 seconds, not {within:g}")
        self.tool = tool or str(getattr(function, "__name__", ""))
        if not self.tool:
            raise TypeError("guard: name the tool (this callable has no __name__)")
        self.signature = inspect.signature(function)
        self.model = _signature_model(self.tool, function, self.signature)
        self.schema = self.model.model_json_schema() if schema is None else schema
        self.run_id = run_id
        self.within = within
        self.call_id = call_id
        self.requested_by = requested_by
        self.description = description

    def ask(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """The call of `args` and `kwargs`, checked. Raises `TypeError` for arguments that do
        not fit the signature or are not JSON, `InvalidArgumentsError` for ones its model
        refuses."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        for name, value in arguments.items():
            _check_json(value, self.tool, name)
        self.values(arguments, source="arguments")
        number = None
        if self.call_id is None:
            key = (self.run_id, self.tool, arguments_digest(arguments))
            number = (key, _NUMBERS.take(key))
            call_id = f"{self.tool[:120]}-{key[2][:24]}-{number[1]}"
        elif isinstance(self.call_id, str):
            call_id = self.call_id
        else:
            call_id = self.call_id(arguments)
        request = {
            "tool": self.tool,
            "arguments": arguments,
            "run_id": self.run_id,
            "call_id": call_id,
            "schema": self.schema,
            "requested_by": self.requested_by,
            "description": self.description,
        }
        return _Call(request, number)

    def values(self, arguments: dict[str, Any], *, source: str) -> dict[str, Any]:
        """`arguments` as the function's parameters take them. Raises `InvalidArgumentsError`."""
        try:
            instance = self.model.model_validate(arguments)
        except ValidationError as exc:
            errors = [
                {
                    "field": ".".join(str(part) for part in error["loc"]) or "(arguments)",
                    "message": error["msg"],
                }
                for error in exc.errors(include_url=False)
            ]
            raise InvalidArgumentsError(tool=self.tool, errors=errors, source=source) from None
        return {
            field.alias or name: getattr(instance, name)
            for name, field in type(instance).model_fields.items()
        }

    def outcome(self, answer: Consumed) -> dict[str, Any]:
        """The arguments to run the call with. Raises `CallDenied`, or
        `InvalidArgumentsError` when the final arguments do not fit the signature."""
        if not answer.approved:
            raise CallDenied(
                tool=self.tool,
                reason=answer.reason,
                decided_by=answer.decided_by,
                approval_id=answer.approval_id,
            )
        source = "edited arguments" if answer.edited else "arguments"
        return self.values(answer.arguments, source=source)


def _signature_model(
    tool: str, function: Callable[..., Any], signature: inspect.Signature
) -> type[BaseModel]:
    """A pydantic model of the parameters of `function` (unknown arguments refused)."""
    try:
        hints = get_type_hints(function)
    except Exception as exc:
        raise TypeError(f"guard {tool!r}: cannot resolve the type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    for index, parameter in enumerate(signature.parameters.values()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(
                f"guard {tool!r}: *{parameter.name} cannot be shown to a reviewer; name each"
                " argument"
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(
                f"guard {tool!r}: argument {parameter.name!r} is positional-only; a guarded"
                " call runs with named arguments"
            )
        default = ... if parameter.default is parameter.empty else parameter.default
        # pydantic keeps `_x` private and warns about names such as `schema`: an alias then.
        name = parameter.name
        if name.startswith("_") or hasattr(BaseModel, name):
            name = f"argument_{index}"
        fields[name] = (hints.get(parameter.name, Any), Field(default, alias=parameter.name))
    model: type[BaseModel] = create_model(
        f"{tool}_arguments", __config__=_ARGUMENTS_CONFIG, **fields
    )
    return model


def _check_json(value: Any, tool: str, path: str) -> None:
    """Raises `TypeError` unless `value` is a JSON value (what a reviewer sees and edits)."""
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"guard {tool!r}: argument {path} is {value!r}, which is not JSON")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, tool, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"guard {tool!r}: argument {path} has the key {key!r}; JSON keys are strings"
                )
            _check_json(item, tool, f"{path}.{key}")
        return
    raise TypeError(
        f"guard {tool!r}: argument {path} is a {type(value).__name__}, not a JSON value"
        " (str, int, float, bool, None, or lists and dicts of them)"
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

    def guard(
        self,
        tool: str | None = None,
        *,
        run_id: str,
        within: float,
        call_id: CallId | None = None,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """A decorator of an async function: each call asks the bot, waits up to `within`
        seconds, and runs once approved, with the final arguments (see the module). A call
        raises `CallDenied`, `DecisionTimeout`, `ApprovalClientError`, or `TypeError` and
        `InvalidArgumentsError` for arguments it cannot ask about."""

        def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
            if not inspect.iscoroutinefunction(function):
                raise TypeError(
                    f"ApprovalClient.guard wraps an async function, and {function!r} is not"
                    " one: use SyncApprovalClient.guard"
                )
            rules = _Guard(
                function,
                tool,
                run_id=run_id,
                within=within,
                call_id=call_id,
                schema=schema,
                requested_by=requested_by,
                description=description,
            )
            run: Callable[..., Awaitable[R]] = function

            @functools.wraps(function)
            async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
                call = rules.ask(args, kwargs)
                try:
                    asked = await self.request(**call.request)
                    if not asked.decided:
                        asked = await self.wait(asked.approval_id, within=rules.within)
                    answer = await self.consume(asked)
                except BaseException:
                    call.free()  # the decision was not taken: a retry asks about this review
                    raise
                return await run(**rules.outcome(answer))

            return guarded

        return decorate

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

    def guard(
        self,
        tool: str | None = None,
        *,
        run_id: str,
        within: float,
        call_id: CallId | None = None,
        schema: dict[str, Any] | None = None,
        requested_by: str | None = None,
        description: str | None = None,
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """`ApprovalClient.guard` for a sync function: each call blocks until decided."""

        def decorate(function: Callable[P, R]) -> Callable[P, R]:
            if inspect.iscoroutinefunction(function):
                raise TypeError(
                    f"SyncApprovalClient.guard wraps a sync function, and {function!r} is"
                    " async: use ApprovalClient.guard"
                )
            rules = _Guard(
                function,
                tool,
                run_id=run_id,
                within=within,
                call_id=call_id,
                schema=schema,
                requested_by=requested_by,
                description=description,
            )
            run: Callable[..., R] = function

            @functools.wraps(function)
            def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
                call = rules.ask(args, kwargs)
                try:
                    asked = self.request(**call.request)
                    if not asked.decided:
                        asked = self.wait(asked.approval_id, within=rules.within)
                    answer = self.consume(asked)
                except BaseException:
                    call.free()  # the decision was not taken: a retry asks about this review
                    raise
                return run(**rules.outcome(answer))

            return guarded

        return decorate

    def _send(self, method: str, path: str, **options: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **options)
        except httpx.HTTPError as exc:
            raise ApprovalClientError(f"the bot could not be reached: {exc}") from exc
