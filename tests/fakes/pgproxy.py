"""A TCP proxy for tests that stands between a client and PostgreSQL and breaks connections
on purpose: drops them (both sides closed at once, as a failover or a dead network path
does), stalls them (nothing forwarded either way for a while, as a congested or partitioned
network does), and refuses new ones for a while (as a database restarting does).

    async with proxying("127.0.0.1", 5432, seed=7) as proxy:
        url = proxy.url("postgresql://postgres@127.0.0.1:5432/test")
        ...  # connect the code under test to `url`
        chaos = asyncio.create_task(proxy.inject(Chaos(gap=0.2)))  # faults at random moments
        ...
        chaos.cancel()
        proxy.heal()  # stalls end and connections are accepted again
        print(proxy.faults)

Faults come from a `random.Random(seed)`: a run's choices of when, which and how long are
the same for the same seed (what they hit depends on the traffic). The proxy is a fake at the
network seam: the client's driver and the server are the real ones, unchanged.

It can lose an answer: with `lose_answer_to`, the first statement sent whose text holds
given bytes is run by the server (and committed, outside a transaction), and the connection
is dropped as the answer to its run comes back.

It can also hold a server's goodbye: with `hold_goodbyes`, what a server sends before it
closes a connection (PostgreSQL's FATAL error for a terminated session) reaches the client,
but the close does not until `let_go()`: the client sees the error of a session that has
ended on a connection that still looks open, which on a real network happens for as long as
the close takes to arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Chaos", "FaultProxy", "Faults", "Link", "proxying"]

CHUNK = 65536


@dataclass
class Faults:
    """What the proxy has done so far."""

    connections: int = 0
    """Client connections accepted and forwarded."""
    drops: int = 0
    """Connections dropped (both sides closed)."""
    stalls: int = 0
    """Stalls begun, long ones included."""
    long_stalls: int = 0
    """Stalls of at least `Chaos.long_stall`'s lower bound."""
    stalled: float = 0.0
    """Seconds of stalls begun, summed."""
    refusals: int = 0
    """Times the proxy began refusing new connections."""
    refused: int = 0
    """Connections refused (closed as soon as accepted)."""
    held: int = 0
    """Server closes held back (`hold_goodbyes`)."""
    lost_answers: int = 0
    """Answers dropped with their connection (`lose_answer_to`)."""


@dataclass(frozen=True)
class Chaos:
    """How `FaultProxy.inject` chooses faults: one every `gap` seconds on average (the gaps
    exponentially distributed); of them, a share `drop` are drops, `refuse` refusals of new
    connections for `refusing` seconds, the rest stalls of one connection, lasting `stall`
    seconds, or `long_stall` for a share `long` of them."""

    gap: float = 0.5
    drop: float = 0.35
    refuse: float = 0.05
    refusing: tuple[float, float] = (0.3, 1.5)
    stall: tuple[float, float] = (0.2, 2.0)
    long_stall: tuple[float, float] = (5.5, 8.0)
    long: float = 0.05


@dataclass(eq=False)
class Link:
    """One client connection and the server connection it is forwarded to."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    """Clear while the link is stalled."""
    server_closed: bool = False
    """Whether the server has closed its side (its goodbye may be held)."""
    losing: bool = False
    """The server's next answer to a statement's run is to be lost (`lose_answer_to`)."""
    _resume: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        self.flowing.set()

    def drop(self) -> None:
        """Close both sides at once, without a goodbye."""
        for writer in (self.client, self.server):
            writer.transport.abort()

    def stall(self, seconds: float) -> None:
        """Forward nothing either way for `seconds` (from now, whatever stall was under way)."""
        if self._resume is not None:
            self._resume.cancel()
        self.flowing.clear()
        self._resume = asyncio.get_running_loop().call_later(seconds, self.resume)

    def resume(self) -> None:
        """Forward again."""
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        self.flowing.set()


class FaultProxy:
    """Forwards connections made to it (on a loopback port of its own) to `host`:`port`."""

    def __init__(self, host: str, port: int, *, seed: int = 0) -> None:
        self._target = (host, port)
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._refusing_until = 0.0
        self._let_go = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.links: set[Link] = set()
        """The links open now."""
        self.faults = Faults()
        self.hold_goodbyes = False
        """While True, a server's close is held back from its client until `let_go()`."""
        self.lose_answer_to: bytes | None = None
        """Bytes of a statement's text (sent when a connection prepares it, the first time
        it runs it): the connection that sends them is dropped as the server answers the
        statement's run (its first answer with a BindComplete message), after it ran (and
        committed, outside a transaction). Once: it is None again after."""

    @property
    def port(self) -> int:
        assert self._server is not None, "the proxy is not started"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def url(self, url: str) -> str:
        """`url` (a database URL of the proxied server) with the proxy's address instead."""
        parts = urlsplit(url)
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def close(self) -> None:
        """Stop accepting, drop every link, and wait for the forwarding to end."""
        if self._server is not None:
            self._server.close()
        self.let_go()
        for link in list(self.links):
            link.drop()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    # Faults on demand.

    def refuse(self, seconds: float) -> None:
        """Close each new connection as soon as it is accepted, for `seconds`."""
        self._refusing_until = asyncio.get_running_loop().time() + seconds
        self.faults.refusals += 1

    def drop(self, link: Link) -> None:
        link.drop()
        self.faults.drops += 1

    def stall(self, link: Link, seconds: float, *, long: bool = False) -> None:
        link.stall(seconds)
        self.faults.stalls += 1
        self.faults.long_stalls += long
        self.faults.stalled += seconds

    def heal(self) -> None:
        """End every stall and refusal now (drops are done)."""
        self._refusing_until = 0.0
        for link in self.links:
            link.resume()

    def let_go(self) -> None:
        """Pass on the closes held back by `hold_goodbyes` (and any later ones)."""
        self.hold_goodbyes = False
        self._let_go.set()

    async def inject(self, chaos: Chaos) -> None:
        """Inject faults as `chaos` says until cancelled."""
        while True:
            await asyncio.sleep(self._random.expovariate(1 / chaos.gap))
            roll = self._random.random()
            if roll < chaos.refuse:
                self.refuse(self._random.uniform(*chaos.refusing))
                continue
            links = sorted(self.links, key=id)  # a seed's choices do not depend on set order
            if not links:
                continue
            link = links[self._random.randrange(len(links))]
            if roll < chaos.refuse + chaos.drop:
                self.drop(link)
            elif self._random.random() < chaos.long:
                self.stall(link, self._random.uniform(*chaos.long_stall), long=True)
            else:
                self.stall(link, self._random.uniform(*chaos.stall))

    # Forwarding.

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if asyncio.get_running_loop().time() < self._refusing_until:
            self.faults.refused += 1
            writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        link = Link(writer, server_writer)
        self.links.add(link)
        self.faults.connections += 1
        upstream = asyncio.create_task(self._pump(link, reader, server_writer, upstream=True))
        downstream = asyncio.create_task(self._pump(link, server_reader, writer, upstream=False))
        for task in (upstream, downstream):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await asyncio.wait([upstream, downstream])
        self.links.discard(link)

    async def _pump(
        self,
        link: Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        try:
            while data := await reader.read(CHUNK):
                await link.flowing.wait()
                if upstream and self.lose_answer_to is not None and self.lose_answer_to in data:
                    self.lose_answer_to = None
                    link.losing = True
                elif not upstream and link.losing and _binds(data):
                    self.faults.lost_answers += 1
                    link.drop()  # the statement ran; its answer never arrives
                    break
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # dropped, or the other side went away: the link ends
        if not upstream:
            link.server_closed = True
            if self.hold_goodbyes:
                self.faults.held += 1
                await self._let_go.wait()
        with contextlib.suppress(OSError):
            writer.close()
        if not upstream:
            link.server.transport.abort()  # the server is gone: nothing more to say to it


def _binds(data: bytes) -> bool:
    """Whether the server's bytes hold a BindComplete message (the answer to a statement's
    run, not to its preparation); `data` starts at a message's start, as a server's answer
    read whole does (a message cut across reads is looked at no further)."""
    at = 0
    while at + 5 <= len(data):
        if data[at : at + 1] == b"2":
            return True
        at += 1 + int.from_bytes(data[at + 1 : at + 5], "big")
    return False


@contextlib.asynccontextmanager
async def proxying(host: str, port: int, *, seed: int = 0) -> AsyncIterator[FaultProxy]:
    """A started `FaultProxy` to `host`:`port`, closed at the end."""
    proxy = FaultProxy(host, port, seed=seed)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
