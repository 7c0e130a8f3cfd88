"""The HTTP client session nodbot sends with keeps nothing a server set between requests."""

from __future__ import annotations

from aiohttp import web

from nodbot.core.outbound import outbound_session


async def test_a_cookie_a_server_sets_is_never_sent_back() -> None:
    seen: list[str | None] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.Response(text="ok")
        response.set_cookie("tracked", "1", path="/")
        return response

    app = web.Application()
    app.router.add_get("/", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with outbound_session() as session:
            # By name: aiohttp's default jar keeps no cookie of a host given as an address.
            for _ in range(2):
                async with session.get(f"http://localhost:{port}/") as response:
                    assert response.status == 200
                    assert "tracked" in response.cookies  # it was set...
    finally:
        await runner.cleanup()
    assert seen == [None, None]  # ...and never sent back
