"""`nodbot serve`: one process, one event loop: the HTTP API served by uvicorn, and the
workers that move runs on (`BotService.work`), over the store of the configuration."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import aiohttp
import uvicorn

from nodbot.bot.config import (
    Config,
    ConfigError,
    load_agents,
    load_config,
    load_framework_agents,
    trust_warnings,
    undecidable_warning,
    unread_replies_warning,
)
from nodbot.bot.config.agents import report_agents
from nodbot.bot.discord.channel import DiscordChannel
from nodbot.bot.discord.interactions import DiscordReviews
from nodbot.bot.email.answers import Answers
from nodbot.bot.email.channel import EmailChannel
from nodbot.bot.email.imap import ImapReader
from nodbot.bot.email.inbound import Inbound
from nodbot.bot.email.listener import MailListener
from nodbot.bot.http import create_app
from nodbot.bot.logs import config_secrets, configure_logging
from nodbot.bot.outbox import Channel
from nodbot.bot.policy.authorize import authorizer_for
from nodbot.bot.service import BotService
from nodbot.bot.slack.channel import SlackChannel
from nodbot.bot.slack.reviews import SlackReviews, connect_socket_mode
from nodbot.bot.store import store_for
from nodbot.bot.supervise import Supervisor
from nodbot.bot.teams.channel import TeamsChannel
from nodbot.bot.teams.reviews import TeamsReviews
from nodbot.bot.web import WebInbox
from nodbot.bot.webhooks import WebhookChannel
from nodbot.core import ToolRegistry
from nodbot.core.outbound import outbound_session
from nodbot.core.waiting import set_within

__all__ = ["CannotListen", "Served", "serve", "serving"]

log = logging.getLogger(__name__)

LISTENER_LOOK = 1.0
"""Seconds between two looks at whether the SMTP / LMTP listener still serves."""


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
    mail_port: int | None = None
    """The port of the SMTP / LMTP listener of `email.inbound.listen`, when there is one."""
    supervisor: Supervisor | None = None
    """What keeps the bot's long-lived tasks running (`bot.supervise`)."""
    mail_listener: MailListener | None = None
    """The SMTP / LMTP listener of `email.inbound.listen`, when there is one."""

    def sign_in_link(self, principal: str) -> str:
        """A link that signs `principal` in to this bot's web inbox. It is signed with the
        secret the inbox uses, the random one made at start when `web.secret` is not set."""
        return self.inbox.sign_in_link(principal, self.url)


@contextlib.asynccontextmanager
async def serving(
    config_file: str,
    *,
    host: str | None = None,
    port: int | None = None,
    configure_logs: bool = False,
) -> AsyncIterator[Served]:
    """Start the bot of `config_file` (port 0 picks a free port) and stop it on exit. With
    `configure_logs`, the file's `log:` section is applied to the process's logging, as
    `nodbot serve` does; code that serves a bot inside a process of its own (tests) keeps
    that process's logging as it is.

    Raises `ConfigError` listing every problem of the file or its agents, `CannotListen`
    when the address cannot be listened on (before anything else is done), and `StoreError`
    when the store cannot be used.
    """
    config = load_config(config_file)
    listening = _listen(
        config.server.host if host is None else host,
        config.server.port if port is None else port,
        config_file,
        host_from="--host" if host is not None else None,
        port_from="--port" if port is not None else None,
    )
    try:
        async with _serving(config, listening, host, configure_logs) as served:
            yield served
    finally:
        listening.close()  # uvicorn closed it when it served; not if it never got that far


@contextlib.asynccontextmanager
async def _serving(
    config: Config,
    listening: socket.socket,
    host: str | None,
    configure_logs: bool,
) -> AsyncIterator[Served]:
    if configure_logs:
        configure_logging(config.log, secrets=config_secrets(config))
    report = report_agents(config)
    if report.problems:
        raise ConfigError(report.problems)
    undecidable = [undecidable_warning(config), unread_replies_warning(config)]
    for warning in [*trust_warnings(config, host=host), *report.warnings, *undecidable]:
        if warning is not None:
            log.warning("%s", warning)
    agents, _ = load_agents(config)
    hosted, _ = load_framework_agents(config)
    store = store_for(config)
    outbound: aiohttp.ClientSession | None = None
    stopped = _Stopped()
    try:
        await store.open()
        registry = ToolRegistry.merged(agent.tools for agent in agents.values())
        # One outbound HTTP session (aiohttp, as slack_sdk uses) for webhooks, Slack and chat.
        outbound = outbound_session()
        for agent in agents.values():  # and for the agents' chat models that made none
            share = getattr(agent.chat, "share_session", None)
            if share is not None:
                share(outbound)
        channels: list[Channel] = []
        if config.webhooks:
            channels.append(WebhookChannel(config.webhooks, session=outbound))
        slack_channel = None
        if config.slack is not None:
            slack_channel = SlackChannel(
                config.slack, store, registry, session=outbound, public_url=config.web.public_url
            )
            channels.append(slack_channel)
        teams_channel = None
        if config.teams is not None:
            teams_channel = TeamsChannel(config.teams, store, registry, session=outbound)
            channels.append(teams_channel)
        discord_channel = None
        if config.discord is not None:
            discord_channel = DiscordChannel(
                config.discord, store, registry, session=outbound, public_url=config.web.public_url
            )
            channels.append(discord_channel)
        email_channel = None
        if config.email is not None:
            secret = config.web.secret.get_secret_value() if config.web.secret else None
            links_base = config.web.public_url or _own_url(listening)
            email_channel = EmailChannel(config.email, store, secret=secret, links_base=links_base)
            channels.append(email_channel)
        # With no channel to tell a review's outcome, the vote that decides it marks its
        # outcome announced at once: no second stage for the outbox (a write transaction).
        store.outcome_stage = any(channel.tells_outcomes for channel in channels)
        authorizer = authorizer_for(config, slack_channel, runs=store)
        # Escalations and reminders reach the reviewers' delegates too, as the authorizer
        # resolves them (one `People`, one reading of the delegations).
        for delegating in (slack_channel, email_channel):
            if delegating is not None:
                delegating.delegations = authorizer.delegations
        # Discord's reminders mention reviewers by the Discord ids of their `people:` entries.
        if discord_channel is not None:
            discord_channel.people = authorizer.people
        service = BotService(
            config,
            store,
            agents,
            channels=channels,
            registry=registry,
            hosted=hosted,
            authorize=authorizer,
        )
        slack = None
        if config.slack is not None and slack_channel is not None:
            slack = SlackReviews(
                config.slack, slack_channel, on_decided=service.decided, authorizer=authorizer
            )
        teams = None
        if teams_channel is not None:
            teams = TeamsReviews(teams_channel, authorizer=authorizer, on_decided=service.decided)
        discord = None
        if config.discord is not None and discord_channel is not None:
            discord = DiscordReviews(
                config.discord, discord_channel, authorizer=authorizer, on_decided=service.decided
            )
        inbox = WebInbox(
            store=store,
            registry=service.registry,
            web=config.web,
            service=service,
            authorize=authorizer,
        )
        inbound = answers = None
        if config.email is not None and email_channel is not None:
            answers = Answers(config.email, email_channel.send, email_channel.templates)
            inbound = Inbound(
                config.email,
                store,
                service.registry,
                secret=config.web.secret.get_secret_value() if config.web.secret else None,
                authorize=authorizer,
                on_decided=service.decided,
                answers=answers,
            )
        app = create_app(
            store=store,
            registry=service.registry,
            tokens=config.api.tokens,
            authorize_decision=authorizer,
            service=service,
            inbox=inbox,
            slack=slack if config.slack is not None and config.slack.mode == "http" else None,
            email=inbound,
            teams=teams,
            discord=discord,
        )
        # uvicorn's own records go through the bot's handler (log_config=None: one format,
        # one stream), and the bot logs each request itself (`AccessLog`).
        config_of_server = uvicorn.Config(
            app, log_level="warning", log_config=None, access_log=False
        )
        server = stopped.server = _Server(config_of_server)
        server.on_shutdown = inbox.close  # its live streams would keep the server waiting
        stop = asyncio.Event()
        serving_task = asyncio.create_task(server.serve(sockets=[listening]))
        # The rest is kept running (`bot.supervise`): restarted when it ends, and said down
        # by /healthz meanwhile. The HTTP server is not: its end is the bot's.
        supervisor = Supervisor(stop, service.health.task_down)
        supervisor.start("workers", lambda: service.work(stop))
        socket_mode = None
        listener = None
        frozen = False
        try:
            await _started(server, serving_task)
            email_in = config.email.inbound if config.email is not None else None
            if inbound is not None and email_in is not None and email_in.listen is not None:
                listener = MailListener(inbound, email_in)
                await listener.start()
                listener.port = listener.bound_port  # listened again on it, port 0 or not
                supervisor.start("email listener", functools.partial(_listening, listener, stop))
            if inbound is not None and email_in is not None and email_in.imap is not None:
                reader = ImapReader(
                    inbound, email_in.imap, on_problem=service.health.mailbox_problem
                )
                supervisor.start("email reader", functools.partial(reader.run, stop))
            if slack is not None and config.slack is not None and config.slack.mode == "socket":
                socket_mode = await connect_socket_mode(slack, config.slack)
            bound_host, bound_port = server.servers[0].sockets[0].getsockname()[:2]
            url = f"http://{bound_host}:{bound_port}"
            mail_port = None if listener is None else listener.bound_port
            # What is alive now (modules, agents, the config, the app) lives as long as the
            # bot: frozen out of the collector's sight, a full collection no longer walks it
            # (60 ms on the event loop with 150,000 objects, under 2 ms frozen).
            gc.collect()
            gc.freeze()
            frozen = True
            stopped.served = True
            yield Served(
                url,
                store.display_url,
                service,
                serving_task,
                inbox,
                mail_port,
                supervisor,
                listener,
            )
        except BaseException as exc:
            stopped.failure = exc
            raise
        finally:
            if frozen:
                gc.unfreeze()  # a process that serves a bot in passing (tests) collects it all
            if listener is not None:
                await listener.close()
            if socket_mode is not None:
                await socket_mode.close_async()  # type: ignore[no-untyped-call]
            server.should_exit = True
            stop.set()
            await asyncio.gather(serving_task, supervisor.wait(), return_exceptions=True)
            if answers is not None:
                await answers.close()
            if discord is not None:
                await discord.close()  # decisions of clicks already answered
            await service.close()
    finally:
        if outbound is not None:
            await outbound.close()  # after the channels (service.close), which used it
        await store.close()
        stopped.say()


@dataclass
class _Stopped:
    """What `nodbot stopped` says, the bot's last line: why it stopped, once it had served."""

    server: _Server | None = None
    served: bool = False
    failure: BaseException | None = None

    def say(self) -> None:
        if not self.served:
            return  # it never served: whoever started it reports why
        failure = self.failure
        if self.server is not None and self.server.stopped_by is not None:
            log.info("nodbot stopped", extra={"reason": self.server.stopped_by})
        elif failure is None or isinstance(failure, GeneratorExit):
            log.info("nodbot stopped", extra={"reason": "closed"})
        elif isinstance(failure, asyncio.CancelledError):
            log.info("nodbot stopped", extra={"reason": "cancelled"})
        else:
            reason = f"{type(failure).__name__}: {failure}"
            log.error("nodbot stopped", extra={"reason": reason})


async def _listening(listener: MailListener, stop: asyncio.Event) -> None:
    """The SMTP / LMTP listener's supervised task: listening again (on the port it had)
    when it was not, and ending (so that it is listened again) when its server stops
    serving before `stop` is set."""
    if not listener.serving:
        await listener.start()
    while not stop.is_set():
        if not listener.serving:
            raise OSError(f"the listener on port {listener.port} stopped serving")
        await set_within(stop, LISTENER_LOOK)


def _own_url(listening: socket.socket) -> str:
    """The bot's address as bound (port 0 made a real one), an address that listens
    everywhere written as loopback."""
    host, port = listening.getsockname()[:2]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class CannotListen(OSError):
    """The bot's address cannot be listened on (in use, not this machine's, not allowed)."""


def _listen(
    host: str, port: int, config_file: str, *, host_from: str | None, port_from: str | None
) -> socket.socket:
    """A socket bound to `host`:`port`, listening; bound here rather than by uvicorn so that
    what is wrong is said in one line, blaming the host or the port and naming where it came
    from (`host_from` / `port_from`, the option; None: the file's `server:`)."""
    host_from = host_from or f"server.host of {config_file}"
    port_from = port_from or f"server.port of {config_file}"
    family, address = _address(host, port, host_from)
    # IPPROTO_TCP said outright: asyncio turns on TCP_NODELAY only for accepted sockets whose
    # protocol says TCP, and `socket.create_server` leaves it 0. Without it, each response
    # after the first on a kept-alive connection waits out the client's delayed ACK (~40 ms).
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(2048)
        return listening
    except OSError as exc:
        listening.close()
        raise _cannot_listen(exc, host, port, host_from, port_from) from None


def _address(host: str, port: int, host_from: str) -> tuple[socket.AddressFamily, Any]:
    """The family and socket address `host` names (an IPv4 one first, when it names both).
    Raises `CannotListen` blaming the host when it names none."""
    name = host.strip("[]")
    # RFC 6761: a name under .invalid never resolves, and resolvers should say so without
    # asking a DNS server; glibc's asks, so it is answered here.
    if name.rstrip(".").lower().rpartition(".")[2] == "invalid":
        found: list[Any] = []
        why = ""
    else:
        try:
            found = socket.getaddrinfo(
                name,
                port,
                type=socket.SOCK_STREAM,
                proto=socket.IPPROTO_TCP,
                flags=socket.AI_PASSIVE,
            )
            why = ""
        except socket.gaierror as exc:
            found, why = [], f" ({exc.strerror})"
    if not found:
        raise CannotListen(
            f"cannot listen on {host}: the host name does not resolve to an address{why}; "
            f"the host came from {host_from}"
        )
    found.sort(key=lambda info: info[0] != socket.AF_INET)
    family, _, _, _, address = found[0]
    return family, address


def _cannot_listen(
    exc: OSError, host: str, port: int, host_from: str, port_from: str
) -> CannotListen:
    """What is wrong, blaming the host or the port as the error says."""
    if exc.errno == errno.EADDRINUSE:
        return CannotListen(
            f"{host}:{port} is in use; pick another port with --port N or in server.port "
            f"(0 picks a free one); the port came from {port_from}"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return CannotListen(
            f"cannot listen on {host}: it is not an address of this machine ({exc.strerror}); "
            "use one it has: 127.0.0.1 for this machine only, 0.0.0.0 for every interface; "
            f"the host came from {host_from}"
        )
    if exc.errno == errno.EACCES and 0 < port < 1024:
        return CannotListen(
            f"{host}:{port} cannot be used ({exc.strerror}): a port below 1024 needs "
            f"privileges; pick another port with --port N or in server.port; the port came "
            f"from {port_from}"
        )
    return CannotListen(
        f"{host}:{port} cannot be used ({exc.strerror}); the host came from {host_from}, the "
        f"port from {port_from}"
    )


class _Server(uvicorn.Server):
    """uvicorn's server, stopped by SIGINT or SIGTERM like uvicorn's, except that it does not
    raise the signal again once stopped: the bot still has its workers, channels and store
    to close, and then ends normally."""

    stopped_by: str | None = None
    """The name of the signal that stopped it (SIGINT, SIGTERM), if one did."""
    on_shutdown: Callable[[], None] | None = None
    """Called as it starts shutting down, before it waits for the open responses: what
    would hold one open for long (the inbox's live streams) ends then."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ValueError):
            self.stopped_by = signal.Signals(sig).name
        super().handle_exit(sig, frame)

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
    async with serving(config_file, host=host, port=port, configure_logs=True) as served:
        announce(f"nodbot: serving {served.url} (store {served.store_url})")
        await asyncio.shield(served.stopped)
