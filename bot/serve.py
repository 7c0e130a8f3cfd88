"""`nodbot serve`: one process, one event loop: the HTTP API served by uvicorn, and the
workers that move runs on (`BotService.work`), over the store of the configuration."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import uvicorn

from bot.authorize import authorizer_for
from bot.config import ConfigError, load_agents, load_config, trust_warnings
from bot.config.agents import report_agents
from bot.http import create_app
from bot.outbox import Channel
from bot.service import BotService
from bot.slack.channel import SlackChannel
from bot.slack.reviews import SlackReviews, connect_socket_mode
from bot.store import store_for
from bot.web import WebInbox
from bot.webhooks import WebhookChannel
from core import ToolRegistry

__all__ = ["Served", "serve", "serving"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """A running bot: where it listens and what it serves."""

    url: str
    """The base URL of the HTTP API, e.g. http://127.0.0.1:8080."""
    store_url: str
    """The store's URL, password hidden."""
    service: BotService
    stopped: asyncio.Task[None]
    """Done when the HTTP server has stopped (it stops on SIGINT and SIGTERM)."""
    inbox: WebInbox
    """The web inbox under /inbox."""

    def sign_in_link(self, principal: str) -> str:
        """A link that signs `principal` in to this bot's web inbox. It is signed with the
        secret the inbox uses, the random one made at start when `web.secret` is not set."""
        return self.inbox.sign_in_link(principal, self.url)


@contextlib.asynccontextmanager
async def serving(
    config_file: str, *, host: str | None = None, port: int | None = None
) -> AsyncIterator[Served]:
    """Start the bot of `config_file` (port 0 picks a free port) and stop it on exit.

    Raises `ConfigError` listing every problem of the file or its agents, and `StoreError`
    when the store cannot be used.
    """
    config = load_config(config_file)
    report = report_agents(config)
    if report.problems:
        raise ConfigError(report.problems)
    for warning in [*trust_warnings(config, host=host), *report.warnings]:
        log.warning("%s", warning)
    agents, _ = load_agents(config)
    store = store_for(config)
    try:
        await store.open()
        registry = ToolRegistry.merged(agent.tools for agent in agents.values())
        channels: list[Channel] = [WebhookChannel(config.webhooks)] if config.webhooks else []
        slack_channel = None
        if config.slack is not None:
            slack_channel = SlackChannel(config.slack, store, registry)
            channels.append(slack_channel)
        service = BotService(config, store, agents, channels=channels, registry=registry)
        authorizer = authorizer_for(config, slack_channel, runs=store)
        slack = None
        if config.slack is not None and slack_channel is not None:
            slack = SlackReviews(
                config.slack, slack_channel, on_decided=service.decided, authorizer=authorizer
            )
        inbox = WebInbox(
            store=store,
            registry=service.registry,
            web=config.web,
            service=service,
            authorize=authorizer,
        )
        app = create_app(
            store=store,
            registry=service.registry,
            tokens=config.api.tokens,
            authorize_decision=authorizer,
            service=service,
            inbox=inbox,
            slack=slack if config.slack is not None and config.slack.mode == "http" else None,
        )
        server = _Server(
            uvicorn.Config(
                app,
                host=host or config.server.host,
                port=config.server.port if port is None else port,
                log_level="warning",
            )
        )
        stop = asyncio.Event()
        serving_task = asyncio.create_task(server.serve())
        working_task = asyncio.create_task(service.work(stop))
        socket = None
        try:
            await _started(server, serving_task)
            if slack is not None and config.slack is not None and config.slack.mode == "socket":
                socket = await connect_socket_mode(slack, config.slack)
            bound_host, bound_port = server.servers[0].sockets[0].getsockname()[:2]
            url = f"http://{bound_host}:{bound_port}"
            yield Served(url, store.display_url, service, serving_task, inbox)
        finally:
            if socket is not None:
                await socket.close_async()  # type: ignore[no-untyped-call]
            server.should_exit = True
            stop.set()
            await asyncio.gather(serving_task, working_task, return_exceptions=True)
            await service.close()
    finally:
        await store.close()


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by SIGINT or SIGTERM like uvicorn's, except that it does not
    raise the signal again once stopped: the bot still has its workers, channels and store
    to close, and then ends normally."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


async def _started(server: uvicorn.Server, task: asyncio.Task[None]) -> None:
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise OSError("the HTTP server stopped before it started")
        await asyncio.sleep(0.01)


async def serve(
    config_file: str,
    *,
    host: str | None = None,
    port: int | None = None,
    announce: Callable[[str], None] = print,
) -> None:
    """Run the bot until the process is told to stop (Ctrl-C, SIGTERM)."""
    async with serving(config_file, host=host, port=port) as served:
        announce(f"nodbot: serving {served.url} (store {served.store_url})")
        await asyncio.shield(served.stopped)
