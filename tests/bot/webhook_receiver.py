"""A webhook receiver for tests: a real HTTP server on a loopback port that checks each
request's signature, keeps what it received, and answers what the test scripts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from nodbot.bot.webhooks import InvalidSignature, verify_signature

SECRET = "webhook-secret-0000000"


@dataclass
class Received:
    """One request as it arrived."""

    event: str
    delivery: str
    body: dict[str, Any]
    signed: bool
    at: float
    cookie: str | None = None  # the Cookie header the request carried


@dataclass
class Receiver:
    """Where the bot posts; `answers` are given to the next requests (then 200)."""

    url: str = ""
    secret: str = SECRET
    received: list[Received] = field(default_factory=list)
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            verify_signature(self.secret, dict(request.headers), raw)
            signed = True
        except InvalidSignature:
            signed = False
        self.received.append(
            Received(
                request.headers.get("x-nodbot-event", ""),
                request.headers.get("x-nodbot-delivery", ""),
                json.loads(raw),
                signed,
                time.monotonic(),
                request.headers.get("cookie"),
            )
        )
        self.arrived.set()
        status, headers = self.answers.pop(0) if self.answers else (200, {})
        return Response(status_code=status, headers=headers)

    def events(self, event: str) -> list[Received]:
        return [r for r in self.received if r.event == event]

    async def wait_for(self, count: int, within: float = 10.0) -> None:
        """Until `count` requests have arrived (fails after `within` seconds)."""
        deadline = time.monotonic() + within
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} arrived"
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), 0.05)


@contextlib.asynccontextmanager
async def receiving(receiver: Receiver | None = None) -> AsyncIterator[Receiver]:
    """A receiver (a new `Receiver` unless given) served by uvicorn on a free loopback port."""
    receiver = Receiver() if receiver is None else receiver
    app = Starlette(routes=[Route("/hook", receiver.handle, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):  # bounded: at most 5 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the receiver did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        receiver.url = f"http://127.0.0.1:{port}/hook"
        yield receiver
    finally:
        server.should_exit = True
        await task
