"""A chat model for OpenAI-compatible chat-completions APIs: OpenAI, vLLM, llama.cpp's server,
Ollama's `/v1`, and any other server that answers `POST {base_url}/chat/completions`.

```python
async with ChatCompletionsModel(base_url="http://127.0.0.1:11434/v1", model="qwen3") as chat:
    result = await run_tool_loop(chat, messages, ctx)
```

How the two sides map:

```
nodbot                          chat completions
SystemMessage / HumanMessage    {"role": "system" | "user", "content"}
AssistantMessage                {"role": "assistant", "content", "tool_calls": [{id, type:
                                 "function", function: {name, arguments: JSON string}}]}
ToolMessage                     {"role": "tool", "tool_call_id", "content"}
ToolSpec                        {"type": "function", "function": {name, description, parameters}}
```

A tool call keeps the id the model gave it (approvals are keyed by it); only a missing id,
or one already used in the conversation, is replaced, because two calls with one id would
share one review. Arguments that are not a JSON object come back as a call whose only
argument is `INVALID_JSON_KEY`: no tool has an argument of that name, so the executor refuses
the call as `invalid-arguments` (nothing runs, nobody is asked) and the model reads the error
in the tool message and may try again, as with any other invalid arguments.

Every failure to get an answer raises `ChatModelError`, naming the URL (never the API key)
and the status or what was wrong; 429 and 5xx answers, and connections that fail, are tried
again a few times first.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from pydantic import BaseModel, ConfigDict, ValidationError

from nodbot.core.calls import ToolCall, new_id
from nodbot.core.errors import ConfigurationError, NodbotError
from nodbot.core.loop import (
    AssistantMessage,
    ChatResponse,
    HumanMessage,
    Message,
    SystemMessage,
    ToolMessage,
)
from nodbot.core.outbound import outbound_session
from nodbot.core.tools import ToolSpec

__all__ = ["INVALID_JSON_KEY", "ChatCompletionsModel", "ChatModelError"]

log = logging.getLogger(__name__)

INVALID_JSON_KEY = "(arguments that are not a JSON object)"
"""The one argument of a call whose arguments the model did not write as a JSON object; its
value is the text the model wrote. Not an identifier, so never the name of a tool argument."""

_RETRIED = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses that say "not now" rather than "not this request"."""

_ERROR_TEXT_LIMIT = 300


class ChatModelError(NodbotError):
    """The chat model gave no usable answer: the server could not be reached, did not answer
    in time, answered with an HTTP error, or answered with something that is not a chat
    completion. `url` never shows a key; `status` is the HTTP status, if there was one."""

    kind: ClassVar[str] = "chat-model-error"

    def __init__(self, message: str, *, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status

    def details(self) -> dict[str, Any]:
        return {"url": self.url, "status": self.status}


class ChatCompletionsModel:
    """A `ChatModel` over an OpenAI-compatible `POST {base_url}/chat/completions`.

    `base_url` is the API's root, `/v1` included (`https://api.openai.com/v1`,
    `http://127.0.0.1:8000/v1`). `api_key` is sent as `Authorization: Bearer`; it is never
    logged, shown in `repr` or put in an error. `temperature` and `max_tokens` are sent only
    when set; `extra_body` is merged into every request for anything else a server takes
    (`{"max_completion_tokens": 500}`, `{"parallel_tool_calls": False}`). `timeout` bounds each
    attempt, in seconds.

    `session` is shared and stays open; without one the model makes its own on first use, and
    `aclose()` (or leaving `async with`) closes it. A 408, 429 or 5xx answer, or a connection that
    fails, is tried again up to `retries` times, after `backoff` seconds doubling, or after
    what the server's `Retry-After` asks; never after more than `max_retry_wait` seconds (a
    server that asks for longer gets its error raised at once). Raises `ConfigurationError`
    for a negative `retries` or a `timeout` that is not positive.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
        session: aiohttp.ClientSession | None = None,
        retries: int = 2,
        backoff: float = 0.5,
        max_retry_wait: float = 20.0,
    ) -> None:
        if retries < 0 or timeout <= 0:
            raise ConfigurationError(
                f"ChatCompletionsModel needs retries >= 0 and timeout > 0, "
                f"not retries={retries}, timeout={timeout}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body or {})
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_retry_wait = max_retry_wait
        self._api_key = api_key
        self._session = session
        self._given = session is not None
        self._owns_session = session is None
        parts = urlsplit(base_url)  # a query (Azure's api-version) stays after the path
        self.url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions"))
        self.shown_url = _without_secrets(self.url)
        """The URL as errors and logs show it: no user, password or query."""

    def __repr__(self) -> str:
        base_url = _without_secrets(self.base_url)
        return f"{type(self).__name__}(base_url={base_url!r}, model={self.model!r})"

    async def __aenter__(self) -> ChatCompletionsModel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    def share_session(self, session: aiohttp.ClientSession) -> bool:
        """Send requests on `session` (the bot's one outbound session, which `nodbot serve`
        hands to each agent's model, and closes when it stops) unless this model was given a
        session when made, or has made its own; whether it took it. A bot started again
        hands over its new session; used after the bot closed its session, the model makes
        one of its own again."""
        if self._given or (self._owns_session and self._session is not None):
            return False
        self._session, self._owns_session = session, False
        return True

    async def aclose(self) -> None:
        """Close the HTTP session this model made; a session it was given stays open."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def respond(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> ChatResponse:
        """The model's next turn. Raises `ChatModelError`."""
        answer = await self._post(self.request_body(messages, tools))
        return self._response(answer, messages)

    def request_body(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> dict[str, Any]:
        """The JSON body of the request for this conversation."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_api_message(message) for message in messages],
        }
        if tools:  # some servers refuse an empty list
            body["tools"] = [_api_tool(spec) for spec in tools]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        body.update(self.extra_body)
        return body

    async def _post(self, body: dict[str, Any]) -> Any:
        headers = {"Accept": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                status, text, response_headers = await self._send(body, headers)
            except aiohttp.ClientError as exc:
                if last:
                    raise self._error(f"cannot be reached: {self._redacted(str(exc))}") from None
                retry_in = self._backoff(attempt)
                what = "cannot be reached"
            else:
                if status < 400:
                    return self._json(status, text)
                wait = None if last else self._retry_wait(status, response_headers, attempt)
                if wait is None:
                    raise self._http_error(status, text, response_headers, attempts=attempt + 1)
                retry_in = wait
                what = f"answered HTTP {status}"
            log.warning("%s %s; trying again in %.2f s", self.shown_url, what, retry_in)
            await asyncio.sleep(retry_in)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _send(
        self, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, str, Mapping[str, str]]:
        """One attempt: the status, text and headers of the answer."""
        session = self._session_for_request()
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with session.post(self.url, json=body, headers=headers, timeout=timeout) as r:
                return r.status, await r.text(errors="replace"), r.headers
        except TimeoutError:
            # Not tried again: a generation that took too long would take as long again.
            raise self._error(f"no answer within {self.timeout:g} s") from None

    def _session_for_request(self) -> aiohttp.ClientSession:
        if self._session is None or (not self._given and self._session.closed):
            # Made here, not in __init__: a session belongs to the running event loop, and an
            # agent module builds its model at import time, before any loop runs.
            self._session, self._owns_session = outbound_session(), True
        return self._session

    def _backoff(self, attempt: int) -> float:
        return float(min(self.backoff * 2**attempt, self.max_retry_wait))

    def _retry_wait(self, status: int, headers: Mapping[str, str], attempt: int) -> float | None:
        """Seconds to wait before the next attempt, or None when there is none: the status is
        not worth another try, or the server asks for a wait longer than `max_retry_wait`."""
        if status not in _RETRIED:
            return None
        asked = _retry_after(headers)
        if asked is None:
            return self._backoff(attempt)
        return asked if asked <= self.max_retry_wait else None

    def _json(self, status: int, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            raise self._error(
                f"HTTP {status} with a body that is not JSON: {self._snippet(text)!r}",
                status=status,
            ) from None

    def _http_error(
        self, status: int, text: str, headers: Mapping[str, str], *, attempts: int
    ) -> ChatModelError:
        detail = _server_message(text) or self._snippet(text)
        message = f"HTTP {status}"
        if detail:
            message += f": {self._redacted(detail)}"
        if attempts > 1:
            message += f" (after {attempts} attempts)"
        asked = _retry_after(headers)
        if status in _RETRIED and asked is not None and asked > self.max_retry_wait:
            message += f" (the server asks to retry after {asked:g} s)"
        return self._error(message, status=status)

    def _response(self, answer: Any, messages: Sequence[Message]) -> ChatResponse:
        try:
            completion = _Completion.model_validate(answer)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}"
                for e in exc.errors(include_url=False)[:3]
            )
            raise self._error(f"the answer is not a chat completion: {problems}") from None
        if not completion.choices:
            raise self._error("the answer has no choices")
        choice = completion.choices[0]
        if choice.finish_reason == "length":
            log.warning("%s: the answer was cut off at the token limit", self.shown_url)
        # The calls decide, not finish_reason: some local servers report "stop" with calls.
        used = {
            call.id
            for message in messages
            if isinstance(message, AssistantMessage)
            for call in message.tool_calls
        }
        calls = []
        for api_call in choice.message.tool_calls or []:
            if api_call.type not in (None, "function"):
                raise self._error(f"the answer has a tool call of type {api_call.type!r}")
            call_id = api_call.id if api_call.id and api_call.id not in used else new_id("call_")
            used.add(call_id)
            arguments = _arguments(api_call.function.arguments)
            if INVALID_JSON_KEY in arguments:
                log.warning(
                    "%s: the arguments of a call of %r are not a JSON object",
                    self.shown_url,
                    api_call.function.name,
                )
            calls.append(ToolCall(id=call_id, name=api_call.function.name, arguments=arguments))
        return ChatResponse(content=choice.message.content or "", tool_calls=calls)

    def _error(self, what: str, *, status: int | None = None) -> ChatModelError:
        return ChatModelError(
            f"chat completions at {self.shown_url}: {what}", url=self.shown_url, status=status
        )

    def _redacted(self, text: str) -> str:
        """`text` without the API key: servers echo a wrong key back in their errors."""
        return text.replace(self._api_key, "***") if self._api_key else text

    def _snippet(self, text: str) -> str:
        text = self._redacted(text.strip())
        if len(text) > _ERROR_TEXT_LIMIT:
            return text[:_ERROR_TEXT_LIMIT] + "..."
        return text


def _api_message(message: Message) -> dict[str, Any]:
    if isinstance(message, SystemMessage | HumanMessage):
        return {"role": message.role, "content": message.content}
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if not message.tool_calls:
        return {"role": "assistant", "content": message.content}
    return {
        "role": "assistant",
        "content": message.content or None,  # the API's "no text" beside calls
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": json.dumps(call.arguments, ensure_ascii=False),
                },
            }
            for call in message.tool_calls
        ],
    }


def _api_tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    }


def _arguments(raw: str | dict[str, Any] | None) -> dict[str, Any]:
    """The arguments of a call as the model wrote them (a JSON string; a few servers send the
    object itself, and an empty string for a tool without arguments)."""
    if isinstance(raw, dict):
        return raw
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {INVALID_JSON_KEY: raw}
    return value if isinstance(value, dict) else {INVALID_JSON_KEY: raw}


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait the server asks for: `retry-after-ms` (OpenAI's), or `Retry-After` in seconds
    or as an HTTP date."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            return max(float(milliseconds) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def _server_message(text: str) -> str | None:
    """The message of an OpenAI-style error body, `{"error": {"message": ...}}`, if it is one."""
    try:
        body = json.loads(text)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message: str = error["message"]
        return message[:_ERROR_TEXT_LIMIT]
    if isinstance(error, str):  # some servers (Ollama, llama.cpp) send a bare string
        return error[:_ERROR_TEXT_LIMIT]
    return None


def _without_secrets(url: str) -> str:
    """`url` without user, password, query or fragment (where keys sometimes ride)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Function(_Answer):
    name: str
    arguments: str | dict[str, Any] | None = None


class _ApiToolCall(_Answer):
    id: str | None = None
    type: str | None = None
    function: _Function


class _ApiMessage(_Answer):
    role: str | None = None
    content: str | None = None
    tool_calls: list[_ApiToolCall] | None = None


class _Choice(_Answer):
    message: _ApiMessage
    finish_reason: str | None = None


class _Completion(_Answer):
    choices: list[_Choice]
