"""The chat-completions model against a local stand-in for `POST /v1/chat/completions`.

The stand-in answers from a script and records every request it got, so the tests read the
exact JSON the model sent (and its bearer header) and the loop runs over real HTTP.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from nodbot.core import (
    Agent,
    ApprovalStore,
    AssistantMessage,
    ChatCompletionsModel,
    ChatModel,
    DeferredApproval,
    Executor,
    HumanMessage,
    MemoryApprovalStore,
    Message,
    SqlApprovalStore,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolRegistry,
    run_tool_loop,
)
from nodbot.core.chat_completions import INVALID_JSON_KEY, ChatModelError

KEY = "sk-test-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Answer:
    """One scripted answer of the stand-in."""

    body: Any = None
    """JSON to answer with; `text` instead for a body that is not JSON."""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    text: str | None = None
    hang: bool = False
    """Answer only when the test ends (a server that never answers in time)."""


@dataclass
class Received:
    headers: dict[str, str]
    body: dict[str, Any]


class StandIn:
    """Plays an OpenAI-compatible chat-completions API from a script."""

    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.requests: list[Received] = []
        self.base_url = ""
        self.released = asyncio.Event()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Received(dict(request.headers), await request.json()))
        if not self.script:
            return web.json_response({"error": {"message": "the script is over"}}, status=418)
        answer = self.script.pop(0)
        if answer.hang:
            await self.released.wait()
        if answer.text is not None:
            return web.Response(text=answer.text, status=answer.status, headers=answer.headers)
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    stand_in = StandIn()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stand_in.completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    stand_in.base_url = f"http://127.0.0.1:{port}/v1"
    try:
        yield stand_in
    finally:
        stand_in.released.set()
        await runner.cleanup()


@pytest.fixture
async def chat(api: StandIn) -> AsyncIterator[ChatCompletionsModel]:
    async with ChatCompletionsModel(
        base_url=api.base_url, model="test-model", api_key=KEY, backoff=0.01
    ) as model:
        yield model


def completion(content: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as OpenAI writes it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1764590000,
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def api_call(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class Shop:
    """Tools of a support agent: a refund needs review, a lookup does not."""

    def __init__(self) -> None:
        self.refunds: list[tuple[str, float]] = []
        self.tools = ToolRegistry()

        @self.tools.tool(confirm=True, effects="destructive")
        def refund(order_id: str, amount: float) -> str:
            """Refund an amount on an order."""
            self.refunds.append((order_id, amount))
            return f"refunded {amount} on {order_id}"

        @self.tools.tool(effects="read")
        def lookup_order(order_id: str) -> str:
            """Look an order up."""
            return f"order {order_id}: delivered"


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ApprovalStore]:
    if request.param == "memory":
        yield MemoryApprovalStore()
        return
    sql = SqlApprovalStore(f"sqlite:///{tmp_path / 'nodbot.db'}")
    try:
        yield await sql.open()
    finally:
        await sql.close()


async def test_the_request_carries_model_messages_tools_and_the_bearer_key(
    api: StandIn, chat: ChatCompletionsModel
) -> None:
    api.script.append(Answer(completion("Order A-1 was delivered.")))
    shop = Shop()
    messages: list[Message] = [
        SystemMessage(content="You are a support agent."),
        HumanMessage(content="Where is A-1?"),
        AssistantMessage(
            tool_calls=[ToolCall(id="call_7", name="lookup_order", arguments={"order_id": "A-1"})]
        ),
        ToolMessage(
            tool_call_id="call_7",
            name="lookup_order",
            content='{"result":"order A-1: delivered"}',
            status="ok",
        ),
    ]

    response = await chat.respond(messages, shop.tools.specs())

    assert response.content == "Order A-1 was delivered."
    assert response.tool_calls == []
    [received] = api.requests
    assert received.headers["Authorization"] == f"Bearer {KEY}"
    assert received.body == {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "Where is A-1?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id": "A-1"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_7",
                "content": '{"result":"order A-1: delivered"}',
            },
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            }
            for spec in shop.tools.specs()
        ],
    }
    assert [tool["function"]["name"] for tool in received.body["tools"]] == [
        "refund",
        "lookup_order",
    ]
    assert received.body["tools"][0]["function"]["parameters"]["required"] == [
        "order_id",
        "amount",
    ]


async def test_knobs_are_sent_only_when_set(api: StandIn) -> None:
    api.script += [Answer(completion("a")), Answer(completion("b"))]
    async with ChatCompletionsModel(base_url=api.base_url, model="m") as plain:
        await plain.respond([HumanMessage(content="hi")], [])
    async with ChatCompletionsModel(
        base_url=api.base_url + "/",
        model="m",
        temperature=0.0,
        max_tokens=64,
        extra_body={"parallel_tool_calls": False},
    ) as tuned:
        await tuned.respond([HumanMessage(content="hi")], [])

    first, second = api.requests
    assert first.body == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert "Authorization" not in first.headers
    assert second.body["temperature"] == 0.0
    assert second.body["max_tokens"] == 64
    assert second.body["parallel_tool_calls"] is False


async def test_a_call_that_needs_review_pauses_the_loop_and_runs_once_when_approved(
    api: StandIn, store: ApprovalStore
) -> None:
    shop = Shop()
    api.script += [
        Answer(
            completion(
                None,
                api_call("call_r1", "refund", '{"order_id": "A-1001", "amount": 120.0}'),
            )
        ),
        Answer(completion("I refunded 120.0 on order A-1001.")),
    ]
    async with ChatCompletionsModel(base_url=api.base_url, model="m", api_key=KEY) as chat:
        agent = Agent(chat, shop.tools, system_prompt="You are a support agent.")
        executor = agent.executor(approval=DeferredApproval(store))
        ctx = executor.context(requested_by="customer@example.com")
        paused = await agent.run("Refund order A-1001, please.", ctx)

    assert paused.finish == "pending"
    [pending] = paused.pending
    assert pending.interrupt.tool_call_id == "call_r1"
    assert pending.interrupt.arguments == {"order_id": "A-1001", "amount": 120.0}
    assert (await store.get(pending.approval_id)).request.call_id == "call_r1"
    assert shop.refunds == []
    assert len(api.requests) == 1  # the paused call is not shown to the model yet

    # Decided and resumed elsewhere: another executor and model, the same store and run id.
    resumer = Executor(shop.tools, approval=DeferredApproval(store))
    await resumer.decide(pending.approval_id, True, decided_by="lead@example.com")
    async with ChatCompletionsModel(base_url=api.base_url, model="m", api_key=KEY) as chat:
        finished = await run_tool_loop(
            chat, paused.messages, resumer.context(ctx.run_id, requested_by=ctx.requested_by)
        )

    assert finished.finish == "stop"
    assert finished.final_text == "I refunded 120.0 on order A-1001."
    assert shop.refunds == [("A-1001", 120.0)]
    assert len(api.requests) == 2
    assert api.requests[1].body["messages"][-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_r1",
                    "type": "function",
                    "function": {
                        "name": "refund",
                        "arguments": '{"order_id": "A-1001", "amount": 120.0}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_r1",
            "content": '{"result":"refunded 120.0 on A-1001"}',
        },
    ]


async def test_arguments_that_are_not_json_reach_the_model_as_invalid_arguments(
    api: StandIn, chat: ChatCompletionsModel
) -> None:
    shop = Shop()
    broken = '{"order_id": "A-1001", "amount": '  # cut off mid-object
    api.script += [
        Answer(completion(None, api_call("call_b", "refund", broken))),
        Answer(completion("Sorry, I could not ask for the refund.")),
    ]
    executor = Executor(shop.tools, approval=DeferredApproval(MemoryApprovalStore()))

    result = await run_tool_loop(chat, [HumanMessage(content="Refund A-1001")], executor.context())

    # Refused before review: nothing ran and nobody was asked; the model read the error.
    assert result.finish == "stop"
    assert shop.refunds == []
    tool_message = result.messages[2]
    assert isinstance(tool_message, ToolMessage)
    assert tool_message.status == "error"
    assert tool_message.tool_call_id == "call_b"
    error = json.loads(tool_message.content)["error"]
    assert error.startswith("invalid arguments for tool 'refund'")
    assert INVALID_JSON_KEY in error
    # What the model wrote goes back to it as JSON, so servers that parse arguments take it.
    sent_call = api.requests[1].body["messages"][1]["tool_calls"][0]
    assert json.loads(sent_call["function"]["arguments"]) == {INVALID_JSON_KEY: broken}


@pytest.mark.parametrize("arguments", ["[1, 2]", "null", '"A-1"'])
async def test_arguments_that_are_json_but_not_an_object_are_refused_too(
    api: StandIn, chat: ChatCompletionsModel, arguments: str
) -> None:
    api.script.append(Answer(completion(None, api_call("call_1", "lookup_order", arguments))))
    response = await chat.respond([HumanMessage(content="?")], [])
    assert response.tool_calls == [
        ToolCall(id="call_1", name="lookup_order", arguments={INVALID_JSON_KEY: arguments})
    ]


async def test_missing_and_reused_call_ids_are_replaced_and_others_kept(
    api: StandIn, chat: ChatCompletionsModel
) -> None:
    # Some local servers number calls per turn ("call_0" every time) or send no id at all.
    api.script.append(
        Answer(
            completion(
                None,
                api_call("call_0", "lookup_order", '{"order_id": "A-2"}'),
                api_call("call_0", "lookup_order", '{"order_id": "A-3"}'),
                api_call(None, "lookup_order", ""),
                api_call("call_9", "lookup_order", '{"order_id": "A-4"}'),
            )
        )
    )
    earlier = AssistantMessage(
        tool_calls=[ToolCall(id="call_9", name="lookup_order", arguments={"order_id": "A-1"})]
    )
    response = await chat.respond([HumanMessage(content="?"), earlier], [])

    ids = [call.id for call in response.tool_calls]
    assert ids[0] == "call_0"
    assert len(set(ids) | {"call_9"}) == 5
    assert response.tool_calls[2].arguments == {}  # an empty string: a call without arguments


async def test_a_500_is_tried_again(api: StandIn, chat: ChatCompletionsModel) -> None:
    api.script += [
        Answer({"error": {"message": "the server is overloaded"}}, status=500),
        Answer(completion("hello")),
    ]
    response = await chat.respond([HumanMessage(content="hi")], [])
    assert response.content == "hello"
    assert len(api.requests) == 2
    assert api.requests[0].body == api.requests[1].body


async def test_a_429_waits_what_retry_after_asks(api: StandIn, chat: ChatCompletionsModel) -> None:
    api.script += [
        Answer({"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "0"}),
        Answer(completion("hello")),
    ]
    assert (await chat.respond([HumanMessage(content="hi")], [])).content == "hello"
    assert len(api.requests) == 2


async def test_a_retry_after_beyond_the_bound_is_raised_at_once(api: StandIn) -> None:
    api.script.append(
        Answer({"error": {"message": "rate limited"}}, status=429, headers={"Retry-After": "120"})
    )
    async with ChatCompletionsModel(base_url=api.base_url, model="m", max_retry_wait=1) as chat:
        with pytest.raises(ChatModelError) as raised:
            await chat.respond([HumanMessage(content="hi")], [])
    assert raised.value.status == 429
    assert "HTTP 429: rate limited" in raised.value.message
    assert "retry after 120 s" in raised.value.message
    assert len(api.requests) == 1


async def test_a_server_that_keeps_failing_is_an_error_after_the_retries(
    api: StandIn, chat: ChatCompletionsModel
) -> None:
    api.script += [Answer({"error": "model is loading"}, status=503) for _ in range(3)]
    with pytest.raises(ChatModelError) as raised:
        await chat.respond([HumanMessage(content="hi")], [])
    assert str(raised.value) == (
        f"chat completions at {api.base_url}/chat/completions: "
        "HTTP 503: model is loading (after 3 attempts)"
    )
    assert raised.value.details() == {"url": f"{api.base_url}/chat/completions", "status": 503}
    assert len(api.requests) == 3


async def test_a_401_is_a_clear_error_that_never_shows_the_key(
    api: StandIn, chat: ChatCompletionsModel
) -> None:
    # Servers echo a wrong key back; the error must not carry it on.
    api.script.append(
        Answer({"error": {"message": f"Incorrect API key provided: {KEY}."}}, status=401)
    )
    with pytest.raises(ChatModelError) as raised:
        await chat.respond([HumanMessage(content="hi")], [])

    error = raised.value
    assert error.status == 401
    assert str(error) == (
        f"chat completions at {api.base_url}/chat/completions: "
        "HTTP 401: Incorrect API key provided: ***."
    )
    assert len(api.requests) == 1  # not tried again
    for shown in (str(error), repr(error), repr(error.details()), repr(chat), str(vars(error))):
        assert KEY not in shown


@pytest.mark.parametrize(
    ("answer", "what"),
    [
        (Answer(text="<html>gateway</html>"), "HTTP 200 with a body that is not JSON"),
        (Answer({"object": "list", "data": []}), "the answer is not a chat completion: choices"),
        (Answer({"choices": []}), "the answer has no choices"),
        (
            Answer({"choices": [{"message": {"tool_calls": [{"id": "c", "function": {}}]}}]}),
            "choices.0.message.tool_calls.0.function.name: Field required",
        ),
    ],
)
async def test_a_malformed_answer_is_a_clear_error(
    api: StandIn, chat: ChatCompletionsModel, answer: Answer, what: str
) -> None:
    api.script.append(answer)
    with pytest.raises(ChatModelError) as raised:
        await chat.respond([HumanMessage(content="hi")], [])
    assert raised.value.message.startswith(f"chat completions at {api.base_url}/chat/completions:")
    assert what in raised.value.message


async def test_no_answer_in_time_is_an_error_and_not_tried_again(api: StandIn) -> None:
    api.script.append(Answer(hang=True))
    async with ChatCompletionsModel(base_url=api.base_url, model="m", timeout=0.2) as chat:
        with pytest.raises(ChatModelError, match=r"no answer within 0\.2 s"):
            await chat.respond([HumanMessage(content="hi")], [])
    assert len(api.requests) == 1


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        yield probe.getsockname()[1]


async def test_a_server_that_cannot_be_reached_is_an_error_naming_the_url(
    closed_port: int,
) -> None:
    url = f"http://user:secret@127.0.0.1:{closed_port}/v1?key=secret"
    async with ChatCompletionsModel(base_url=url, model="m", backoff=0.01) as chat:
        with pytest.raises(ChatModelError) as raised:
            await chat.respond([HumanMessage(content="hi")], [])
    assert raised.value.url == f"http://127.0.0.1:{closed_port}/v1/chat/completions"
    assert "cannot be reached" in raised.value.message
    assert "secret" not in str(raised.value)
    assert "secret" not in repr(chat)


async def test_a_shared_session_stays_open_and_an_own_one_is_closed(api: StandIn) -> None:
    api.script += [Answer(completion("a")), Answer(completion("b"))]
    async with aiohttp.ClientSession() as session:
        async with ChatCompletionsModel(base_url=api.base_url, model="m", session=session) as chat:
            await chat.respond([HumanMessage(content="hi")], [])
        assert not session.closed

    own = ChatCompletionsModel(base_url=api.base_url, model="m")
    await own.respond([HumanMessage(content="hi")], [])
    made = own._session
    await own.aclose()
    assert made is not None and made.closed


async def test_a_model_without_a_session_takes_the_bots_and_leaves_it_open(
    api: StandIn,
) -> None:
    api.script += [Answer(completion(text)) for text in "abc"]
    async with aiohttp.ClientSession() as bots, aiohttp.ClientSession() as given:
        chat = ChatCompletionsModel(base_url=api.base_url, model="m")
        assert chat.share_session(bots)
        await chat.respond([HumanMessage(content="hi")], [])
        assert chat._session is bots
        await chat.aclose()
        assert not bots.closed

        # A bot started again hands over its new session; after the bot closed its session
        # the model makes one of its own, and closes that one.
        async with aiohttp.ClientSession() as again:
            assert chat.share_session(again)
            assert chat._session is again
        await chat.respond([HumanMessage(content="hi")], [])
        own = chat._session
        assert own is not again and own is not None
        await chat.aclose()
        assert own.closed

        # A session given by the model's maker, or made by the model already, is kept.
        mine = ChatCompletionsModel(base_url=api.base_url, model="m", session=given)
        assert not mine.share_session(bots)
        assert mine._session is given
        made = ChatCompletionsModel(base_url=api.base_url, model="m")
        await made.respond([HumanMessage(content="hi")], [])
        assert not made.share_session(bots)
        assert made._session is not bots
        await made.aclose()


def test_it_is_a_chat_model_and_its_repr_names_no_key() -> None:
    chat = ChatCompletionsModel(base_url="https://api.openai.com/v1", model="gpt", api_key=KEY)
    assert isinstance(chat, ChatModel)
    assert repr(chat) == ("ChatCompletionsModel(base_url='https://api.openai.com/v1', model='gpt')")


async def test_the_example_agent_runs_on_a_local_server(api: StandIn) -> None:
    api.script += [
        Answer(completion(None, api_call("call_l", "lookup_order", '{"order_id": "A-1001"}'))),
        Answer(completion("Order A-1001 was delivered.")),
    ]
    env = {**os.environ, "OPENAI_BASE_URL": api.base_url, "OPENAI_MODEL": "local-model"}
    env.pop("OPENAI_API_KEY", None)  # a local server needs none
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "examples" / "openai_agent.py"),
        "Where is order A-1001?",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()

    assert (process.returncode, err) == (0, b"")
    assert out.decode().splitlines()[-1] == "stop Order A-1001 was delivered."
    assert [r.body["model"] for r in api.requests] == ["local-model", "local-model"]
    assert "Authorization" not in api.requests[0].headers
    assert api.requests[1].body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_l",
        "content": '{"result":"order A-1001: delivered, total 120.0"}',
    }
