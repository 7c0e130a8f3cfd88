"""A private Dovecot IMAP server on 127.0.0.1 for tests.

`dovecot(directory)` starts a real Dovecot (`dovecot -F`, a child of the test) with its own
configuration, one user with a password, and a Maildir with `INBOX` and `Processed`. It
speaks plain IMAP (no TLS) on a free port and has IDLE and MOVE. The bot's IMAP reader runs
against it unchanged; the test seeds and checks mail through the server's helpers, which use
the standard library's `imaplib`:

    async with dovecot(tmp_path) as imap:
        await imap.append(raw_message)
        ...  # run the reader against imap.host, imap.port, imap.username, imap.password
        await imap.wait_until("Processed", lambda stored: len(stored) == 1)

Dovecot comes from Debian's `dovecot-imapd` package; `.ci/run` installs it when
`/usr/sbin/dovecot` is missing. Without it the tests skip, except under CI, where they fail.
The package's own service is not used: each server has its own configuration, sockets and
port, and stops when its `async with` ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import imaplib
import os
import pathlib
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass

import pytest

HOST = "127.0.0.1"
USERNAME = "nodbot"
DOVECOT_PATHS = ("/usr/sbin/dovecot", "/usr/local/sbin/dovecot")
NOT_INSTALLED = "Dovecot is not installed (apt-get install dovecot-imapd); .ci/run installs it"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0
STOP_REPEAT = 0.5
PORT_ATTEMPTS = 5
POLL_EVERY = 0.05

_FLAGS = re.compile(rb"FLAGS \(([^)]*)\)")
_UID = re.compile(rb"UID (\d+)")


def dovecot_binary() -> str:
    """The path of the dovecot binary. Skips the test when missing (fails it under CI)."""
    found = shutil.which("dovecot") or next(
        (path for path in DOVECOT_PATHS if os.access(path, os.X_OK)), None
    )
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {NOT_INSTALLED}")
        pytest.skip(NOT_INSTALLED)
    return found


@dataclass(frozen=True)
class Stored:
    """A message as the server holds it. `flags` leaves out the per-session \\Recent."""

    uid: int
    flags: frozenset[str]
    raw: bytes


@dataclass(frozen=True)
class ImapServer:
    """A running Dovecot: where to connect, the one account, and helpers to seed and read mail."""

    host: str
    port: int
    username: str
    password: str
    log: pathlib.Path

    def connect(self) -> imaplib.IMAP4:
        """A new `imaplib` client, logged in. The caller logs out."""
        client = imaplib.IMAP4(self.host, self.port, timeout=10)
        try:
            client.login(self.username, self.password)
        except BaseException:
            client.shutdown()
            raise
        return client

    async def append(
        self, raw: bytes, mailbox: str = "INBOX", *, flags: Collection[str] = ()
    ) -> None:
        """Put a message into `mailbox` with IMAP APPEND, as delivered mail arrives."""
        await asyncio.to_thread(self._append, raw, mailbox, flags)

    async def messages(self, mailbox: str = "INBOX") -> list[Stored]:
        """The messages in `mailbox` by UID, read with BODY.PEEK[] so none becomes \\Seen."""
        return await asyncio.to_thread(self._messages, mailbox)

    async def wait_until(
        self,
        mailbox: str,
        check: Callable[[list[Stored]], bool],
        timeout: float = 15.0,  # noqa: ASYNC109 (a deadline for polling, not for one call)
        *,
        what: str | None = None,
    ) -> list[Stored]:
        """Poll `mailbox` until `check(messages)` holds and return those messages.

        Raises `TimeoutError` naming `what` (or `check`) after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            stored = await self.messages(mailbox)
            if check(stored):
                return stored
            if time.monotonic() >= deadline:
                seen = [(message.uid, sorted(message.flags)) for message in stored]
                name = what or getattr(check, "__qualname__", repr(check))
                raise TimeoutError(
                    f"{mailbox}: {name} did not hold within {timeout} s; last seen {seen}"
                )
            await asyncio.sleep(POLL_EVERY)

    def _append(self, raw: bytes, mailbox: str, flags: Collection[str]) -> None:
        client = self.connect()
        try:
            listed = "(" + " ".join(flags) + ")" if flags else None
            status, data = client.append(_quoted(mailbox), listed, None, raw)
            if status != "OK":
                raise imaplib.IMAP4.error(f"APPEND to {mailbox} failed: {data!r}")
        finally:
            client.logout()

    def _messages(self, mailbox: str) -> list[Stored]:
        client = self.connect()
        try:
            status, data = client.select(_quoted(mailbox), readonly=True)
            if status != "OK":
                raise imaplib.IMAP4.error(f"EXAMINE {mailbox} failed: {data!r}")
            status, data = client.uid("FETCH", "1:*", "(UID FLAGS BODY.PEEK[])")
            if status != "OK":
                raise imaplib.IMAP4.error(f"FETCH in {mailbox} failed: {data!r}")
        finally:
            client.logout()
        items: list[object] = list(data)  # a (head, body) tuple per message, b")" between
        stored = [_parse(item) for item in items if isinstance(item, tuple)]
        return sorted(stored, key=lambda message: message.uid)


def _quoted(mailbox: str) -> str:
    escaped = mailbox.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _parse(item: tuple[object, ...]) -> Stored:
    head, raw = item
    if not isinstance(head, bytes) or not isinstance(raw, bytes):
        raise imaplib.IMAP4.error(f"unexpected FETCH response: {item!r}")
    uid, flags = _UID.search(head), _FLAGS.search(head)
    if uid is None or flags is None:
        raise imaplib.IMAP4.error(f"unexpected FETCH response: {head!r}")
    names = frozenset(flags.group(1).decode().split()) - {"\\Recent"}
    return Stored(uid=int(uid.group(1)), flags=names, raw=raw)


@dataclass(frozen=True)
class _Accounts:
    """The system users Dovecot's processes and the mail run as."""

    mail_user: str
    mail_group: str
    login_user: str
    uid: int
    gid: int
    chroot: bool  # only root may chroot


def _accounts() -> _Accounts:
    if os.getuid() != 0:
        me = pwd.getpwuid(os.getuid())
        group = grp.getgrgid(os.getgid()).gr_name
        return _Accounts(me.pw_name, group, me.pw_name, me.pw_uid, me.pw_gid, chroot=False)
    # As root Dovecot refuses mail access as root: use the package's unprivileged users.
    mail = _user("dovecot") or pwd.getpwnam("nobody")
    login = _user("dovenull") or mail
    group = grp.getgrgid(mail.pw_gid).gr_name
    return _Accounts(mail.pw_name, group, login.pw_name, mail.pw_uid, mail.pw_gid, chroot=True)


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def _config(
    runtime: pathlib.Path, log: pathlib.Path, passwd: pathlib.Path, port: int, who: _Accounts
) -> str:
    no_chroot = "" if who.chroot else "  chroot =\n"
    return f"""\
# A private Dovecot for one test; nothing here is read from /etc/dovecot.
base_dir = {runtime / "run"}
state_dir = {runtime / "state"}
instance_name = nodbot-test-{port}
log_path = "{log}"
auth_verbose = yes
protocols = imap
listen = {HOST}
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
default_internal_user = {who.mail_user}
default_internal_group = {who.mail_group}
default_login_user = {who.login_user}
mail_uid = {who.uid}
mail_gid = {who.gid}
first_valid_uid = {who.uid}
first_valid_gid = {who.gid}
mail_location = maildir:~/Maildir
passdb {{
  driver = passwd-file
  args = scheme=PLAIN {passwd}
}}
userdb {{
  driver = passwd-file
  args = {passwd}
}}
namespace inbox {{
  inbox = yes
  mailbox Processed {{
    auto = create
  }}
}}
service anvil {{
{no_chroot}  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
service imap-login {{
{no_chroot}  inet_listener imap {{
    address = {HOST}
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
"""


def _tail(log: pathlib.Path, offset: int = 0, lines: int = 30) -> str:
    try:
        with log.open("rb") as file:
            file.seek(offset)
            text = file.read().decode(errors="replace")
    except OSError as error:
        return f"(no log: {error})"
    return "\n".join(text.splitlines()[-lines:])


async def _greets(port: int) -> bool:
    """Whether an IMAP server answers on `port` with `* OK`."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 2)
    except (OSError, TimeoutError):
        return False
    try:
        line = await asyncio.wait_for(reader.readline(), 2)
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return line.startswith(b"* OK")


async def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to Dovecot's process group, SIGKILL to what is left after a few seconds.

    The whole group at once, as the master alone waits about a second for its children. A
    master stopping may restart a child that stopped first: the group gets SIGTERM again
    after `STOP_REPEAT`. The master stays unreaped until the end, so its group id cannot be
    taken by another process meanwhile.
    """
    if process.poll() is not None:
        return  # reaped already: its group id may belong to someone else by now
    _signal_group(process, signal.SIGTERM)
    started = time.monotonic()
    repeated = False
    while not _exited(process) and time.monotonic() - started < STOP_TIMEOUT:
        if not repeated and time.monotonic() - started >= STOP_REPEAT:
            _signal_group(process, signal.SIGTERM)
            repeated = True
        await asyncio.sleep(0.02)
    _signal_group(process, signal.SIGKILL)  # stragglers; the master too if it hangs
    await asyncio.to_thread(process.wait)


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def _exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether the process has exited, leaving it unreaped."""
    flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
    return os.waitid(os.P_PID, process.pid, flags) is not None


def _spawn(binary: str, config: pathlib.Path, log: pathlib.Path) -> subprocess.Popen[bytes]:
    """`dovecot -F` in a process group of its own, its output appended to the log."""
    with log.open("ab") as output:
        return subprocess.Popen(
            [binary, "-F", "-c", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )


async def _start(
    binary: str, config: pathlib.Path, log: pathlib.Path, port: int
) -> subprocess.Popen[bytes] | None:
    """Dovecot, greeting on `port`; None when the port was taken meanwhile."""
    offset = await asyncio.to_thread(_size, log)
    process = await asyncio.to_thread(_spawn, binary, config, log)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not await _greets(port):
            if process.poll() is not None:
                tail = await asyncio.to_thread(_tail, log, offset)
                if "Address already in use" in tail:
                    return None
                raise RuntimeError(
                    f"dovecot exited with {process.returncode} before it greeted on port "
                    f"{port}; its log ({log}):\n{tail}"
                )
            if time.monotonic() >= deadline:
                tail = await asyncio.to_thread(_tail, log, offset)
                raise TimeoutError(
                    f"dovecot did not greet on port {port} within {START_TIMEOUT} s; "
                    f"its log ({log}):\n{tail}"
                )
            await asyncio.sleep(POLL_EVERY)
    except BaseException:
        await _stop(process)
        raise
    return process


def _size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _prepare(runtime: pathlib.Path, who: _Accounts) -> tuple[pathlib.Path, str]:
    """The password file with the one user, and an empty home, owned by the mail user."""
    password = secrets.token_urlsafe(16)
    home = runtime / "home"
    home.mkdir()
    passwd = runtime / "passwd"
    passwd.write_text(f"{USERNAME}:{{PLAIN}}{password}::::{home}::\n")
    for path in (runtime, home, passwd):
        os.chown(path, who.uid, who.gid)
    return passwd, password


@contextlib.asynccontextmanager
async def dovecot(directory: pathlib.Path) -> AsyncIterator[ImapServer]:
    """Run a private Dovecot, configured in `directory`, and yield how to reach it.

    The configuration and the log (`dovecot.log`) are in `directory`. Sockets, the password
    file and the Maildir are in a short private directory under /tmp that the mail user can
    reach (UNIX socket paths are limited to 108 bytes, and pytest's tmp_path is private to
    the user running the tests); it is removed afterwards.
    """
    binary = dovecot_binary()
    config, log = directory / "dovecot.conf", directory / "dovecot.log"
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    runtime = pathlib.Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="dc", dir="/tmp"))
    try:
        who = _accounts()
        passwd, password = await asyncio.to_thread(_prepare, runtime, who)
        process = None
        for _ in range(PORT_ATTEMPTS):
            port = _free_port()
            text = _config(runtime, log, passwd, port, who)
            await asyncio.to_thread(config.write_text, text)
            process = await _start(binary, config, log, port)
            if process is not None:
                break
        if process is None:
            raise RuntimeError(f"dovecot found no free port in {PORT_ATTEMPTS} attempts")
        try:
            yield ImapServer(HOST, port, USERNAME, password, log)
        finally:
            await _stop(process)
    finally:
        await asyncio.to_thread(shutil.rmtree, runtime, ignore_errors=True)
