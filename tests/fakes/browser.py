"""A real browser for tests: Debian's headless Chromium, driven over the DevTools protocol
(JSON over one WebSocket, the `websockets` package), to see pages as a reviewer's phone lays
them out.

    async with chromium(tmp_path) as browser:
        page = await browser.page(width=390, height=844)
        await page.goto(url)
        width = await page.evaluate("document.documentElement.scrollWidth")
        await page.screenshot(tmp_path / "inbox.png")

The browser resolves no name but loopback addresses (`--host-resolver-rules`), uses no proxy
and keeps its profile in the test's folder, so a test never reaches another host. Every
wait is bounded and fails naming what did not come.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

__all__ = ["CHROMIUM", "Browser", "BrowserError", "Page", "chromium", "chromium_missing"]

CHROMIUM = os.environ.get("NODBOT_TEST_CHROMIUM", "/usr/bin/chromium")
"""The browser to start (Debian's package puts it here)."""
STARTUP = 60.0
"""Seconds the browser may take to say where its DevTools listen (a busy machine)."""
ANSWER = 30.0
"""Seconds a command, or a page's load, may take."""

_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")
_FLAGS = (
    "--headless",
    "--no-sandbox",  # tests run as root in containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-proxy-server",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-features=Translate,MediaRouter,OptimizationHints",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


class BrowserError(AssertionError):
    """The browser would not start, refused a command, or did not answer in time."""


def chromium_missing() -> str | None:
    """Why no browser test can run here (None: Chromium is installed)."""
    if shutil.which(CHROMIUM) is None:
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or NODBOT_TEST_CHROMIUM)"
    return None


class Browser:
    """One running Chromium and its DevTools connection."""

    def __init__(self, process: asyncio.subprocess.Process, socket: ClientConnection) -> None:
        self._process = process
        self._socket = socket
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: list[tuple[str, str | None, asyncio.Future[dict[str, Any]]]] = []
        self._reader = asyncio.create_task(self._read())

    async def send(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        """Send one DevTools command (to a page's `session`); its result. Raises
        `BrowserError` for a refusal or no answer within `ANSWER` seconds."""
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        answer = asyncio.get_running_loop().create_future()
        self._answers[number] = answer
        await self._socket.send(json.dumps(message))
        try:
            async with asyncio.timeout(ANSWER):
                found = await answer
        except TimeoutError:
            raise BrowserError(f"the browser did not answer {method} in {ANSWER:g} s") from None
        finally:
            self._answers.pop(number, None)
        if "error" in found:
            raise BrowserError(f"the browser refused {method}: {found['error']}")
        result: dict[str, Any] = found.get("result", {})
        return result

    def expect(self, method: str, *, session: str | None = None) -> asyncio.Future[dict[str, Any]]:
        """A future of the next event `method` (of a page's `session`): ask before acting."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiters.append((method, session, future))
        return future

    async def page(self, *, width: int, height: int, mobile: bool = True) -> Page:
        """A new tab laid out `width` CSS pixels wide, as a phone (`mobile`: the page's
        viewport meta is obeyed, as a phone's browser does) or a desktop window."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )
        return page

    async def _read(self) -> None:
        async for text in self._socket:
            message = json.loads(text)
            if "id" in message:
                answer = self._answers.get(message["id"])
                if answer is not None and not answer.done():
                    answer.set_result(message)
                continue
            method, session = message.get("method"), message.get("sessionId")
            for waiter in list(self._waiters):
                name, wanted, future = waiter
                if name == method and wanted in (None, session):
                    self._waiters.remove(waiter)
                    if not future.done():
                        future.set_result(message.get("params", {}))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.send("Browser.close")
        await self._socket.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Page:
    """One tab of the browser."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A DevTools command to this tab."""
        return await self.browser.send(method, params, session=self.session)

    async def goto(self, url: str) -> None:
        """Open `url` and wait for its load event. Raises `BrowserError` when the page
        cannot be had or does not load within `ANSWER` seconds."""
        loaded = self.browser.expect("Page.loadEventFired", session=self.session)
        answer = await self.send("Page.navigate", {"url": url})
        if answer.get("errorText"):
            loaded.cancel()
            raise BrowserError(f"the browser could not open {url}: {answer['errorText']}")
        try:
            async with asyncio.timeout(ANSWER):
                await loaded
        except TimeoutError:
            raise BrowserError(f"{url} did not load in {ANSWER:g} s") from None

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON values)."""
        answer = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression} raised: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (beyond the screen's height too), written to `path`."""
        answer = await self.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
        )
        await asyncio.to_thread(path.write_bytes, base64.b64decode(answer["data"]))
        return path


@contextlib.asynccontextmanager
async def chromium(folder: Path) -> AsyncIterator[Browser]:
    """A headless Chromium with its profile under `folder`, stopped after. Raises
    `BrowserError` when it does not start within `STARTUP` seconds."""
    profile = folder / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        *_FLAGS,
        f"--user-data-dir={profile}",
        "about:blank",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    said: list[str] = []
    drain: asyncio.Task[None] | None = None
    try:
        url = await _listening(process, said)
        drain = asyncio.create_task(_drain(process, said))  # a full pipe would stall it
        async with connect(url, max_size=None, ping_interval=None) as socket:
            browser = Browser(process, socket)
            try:
                yield browser
            finally:
                await browser.close()
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


async def _listening(process: asyncio.subprocess.Process, said: list[str]) -> str:
    """The DevTools address the browser prints on its standard error."""
    assert process.stderr is not None
    try:
        async with asyncio.timeout(STARTUP):
            while line := (await process.stderr.readline()).decode(errors="replace"):
                said.append(line.rstrip())
                found = _LISTENING.search(line)
                if found:
                    return found.group(1)
    except TimeoutError:
        pass
    tail = "\n".join(said[-20:])
    raise BrowserError(f"{CHROMIUM} did not start its DevTools within {STARTUP:g} s:\n{tail}")


async def _drain(process: asyncio.subprocess.Process, said: list[str]) -> None:
    assert process.stderr is not None
    while line := await process.stderr.readline():
        said.append(line.decode(errors="replace").rstrip())
        del said[:-50]
