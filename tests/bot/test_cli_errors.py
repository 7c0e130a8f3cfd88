"""The command line's mistakes: every bad input (the command line, the configuration file, the
files it names) exits 2 with what and where; 1 is kept for what fails while running (the
store cannot be used, a run that is not there, an audit chain that does not verify)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from nodbot.bot.cli import build_parser, main
from nodbot.bot.config import ConfigError, load_config
from tests.bot.test_cli import nodbot


def file(folder: Path, text: str, name: str = "nodbot.yml") -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def good(folder: Path) -> Path:
    """A configuration file that loads: its store in `folder`."""
    return file(folder, f'store: {{url: "sqlite:///{folder / "nodbot.db"}"}}\n')


def status_of(arguments: list[str]) -> int:
    """The exit status of `nodbot ARGUMENTS`, argparse's own (SystemExit) included."""
    try:
        return main(arguments)
    except SystemExit as exit:
        return int(exit.code or 0)


# --- exit statuses ---------------------------------------------------------------------------

# A file that is not there, one that is not YAML, one that fails the schema, one that names
# an unset environment variable: each is a bad input, whatever the command.
BAD_FILES = {
    "missing": None,
    "yaml": "store: {url: [\n",
    "schema": "server: {port: high}\n",
    "variable": 'store: {url: "${NODBOT_TEST_NEVER_SET}"}\n',
    "unreadable": b"\xff\xfe not text",
}

# Every command that reads a configuration file, with the file's place as FILE.
COMMANDS = {
    "check-config": ["check-config", "FILE"],
    "serve": ["serve", "--config", "FILE", "--port", "0"],
    "inbox-link": ["inbox-link", "--config", "FILE", "--reviewer", "lead@example.com"],
    "approvals": ["approvals", "list", "--config", "FILE"],
    "runs": ["runs", "show", "run_1", "--config", "FILE"],
    "audit": ["audit", "verify", "--config", "FILE"],
    "sessions": ["sessions", "revoke", "--principal", "ana@example.com", "-c", "FILE"],
}


def bad_file(folder: Path, kind: str) -> Path:
    path = folder / "nodbot.yml"
    content = BAD_FILES[kind]
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_configuration_file_exits_2_whatever_the_command(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    kind: str,
) -> None:
    monkeypatch.delenv("NODBOT_TEST_NEVER_SET", raising=False)
    path = bad_file(tmp_path, kind)
    arguments = [str(path) if word == "FILE" else word for word in COMMANDS[command]]
    assert main(arguments) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err.startswith(f"{path}:"), said.err
    assert "Traceback" not in said.err


def test_the_installed_command_exits_2_on_a_file_problem(tmp_path: Path) -> None:
    path = file(tmp_path, "colour: blue\n")
    completed = subprocess.run(
        [nodbot(), "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert (completed.returncode, completed.stdout) == (2, "")
    assert completed.stderr.startswith(f"{path}:1: colour: unknown key 'colour'")


def test_other_bad_inputs_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = str(good(tmp_path))
    monkeypatch.delenv("NODBOT_TEST_NO_KEY", raising=False)
    cases = {
        # a store URL of no supported database
        ("migrate", "--store", "foo://x"): "nodbot migrate: error: argument --store: expected",
        ("audit", "verify", "--store", "foo://x"): (
            "nodbot audit verify: error: argument --store: expected sqlite:///path.db, "
            "postgresql://user@host/db or a file path; the scheme 'foo' is not supported"
        ),
        # a key variable that is not set
        ("audit", "verify", "--store", "sqlite:///x.db", "--key-env", "NODBOT_TEST_NO_KEY"): (
            "nodbot: the environment variable NODBOT_TEST_NO_KEY (--key-env) is not set"
        ),
        # an output file that cannot be written
        ("audit", "export", "--config", config, "--output", str(tmp_path / "no" / "x.jsonl")): (
            f"nodbot: cannot write {tmp_path / 'no' / 'x.jsonl'}"
        ),
        # an agent the file does not name
        ("runs", "start", "sales", "hi", "--config", config): "nodbot: unknown agent 'sales'",
        # a reviewer of no name
        ("sessions", "revoke", "--principal", " ", "-c", config): "nodbot: --principal names",
        # a web inbox link from a file without web.secret
        ("inbox-link", "--reviewer", "lead@example.com", "--config", config): (
            "nodbot: web.secret is not set"
        ),
        # a folder that cannot be made
        ("init", "--dir", str(tmp_path / "nodbot.yml" / "sub")): "nodbot: cannot write",
    }
    for arguments, start in cases.items():
        assert status_of(list(arguments)) == 2, arguments
        said = capsys.readouterr()
        assert said.err.startswith(start), (arguments, said.err)
        assert len(said.err.strip().splitlines()) == 1, said.err


def test_what_fails_while_running_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(good(tmp_path))
    assert main(["migrate", "--store", f"sqlite:///{tmp_path / 'no' / 'n.db'}"]) == 1
    assert "cannot use the database" in capsys.readouterr().err
    assert main(["runs", "show", "run_nope", "--config", config]) == 1
    assert "no run with id 'run_nope'" in capsys.readouterr().err


def test_the_help_says_what_each_exit_status_means() -> None:
    text = build_parser().format_help()
    assert "exit status: 0 done; 1 failed while running" in " ".join(text.split())
    assert "2 a bad input" in " ".join(text.split())


# --- did you mean ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "where", "meant"),
    [
        ("rule:\n  - tool: refund\n", 1, "rule", "rules"),
        (
            "rules:\n  - tool: refund\n    reviewer: [lead@example.com]\n",
            3,
            "rules.0.reviewer",
            "reviewers",
        ),
        (
            "rules:\n  - tool: refund\n    reviewers: [a@example.com]\n    timout: 1h\n",
            4,
            "rules.0.timout",
            "timeout",
        ),
        ("slack:\n  bot_tokn: ${X:-xoxb-0000000000000000}\n", 2, "slack.bot_tokn", "bot_token"),
        ("email:\n  form: nodbot@example.com\n", 2, "email.form", "from"),
        ("email:\n  inbound:\n    lisen: 127.0.0.1:2525\n", 3, "email.inbound.lisen", "listen"),
        ("server:\n  prot: 8080\n", 2, "server.prot", "port"),
        (
            "rules:\n  - tool: a\n    when: {gtt: {amount: 1}}\n    decision: deny\n",
            3,
            "rules.0.when.gtt",
            "gt",
        ),
    ],
)
def test_an_unknown_key_says_which_was_meant(
    tmp_path: Path, text: str, line: int, where: str, meant: str
) -> None:
    path = file(tmp_path, text)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    [found] = [p for p in refused.value.problems if f": {where}: " in p]
    assert found.startswith(f"{path}:{line}: {where}: unknown "), found
    assert f"did you mean {meant!r}?" in found


def test_a_key_like_none_lists_the_keys_without_a_guess(tmp_path: Path) -> None:
    path = file(tmp_path, "email:\n  zzz: 1\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    [found] = [p for p in refused.value.problems if ": email.zzz: " in p]
    assert "did you mean" not in found
    # the keys as the file writes them: `from`, not the field's name
    assert "expected one of: from, reply_to, smtp" in found


# --- --host ----------------------------------------------------------------------------------


def serve_mistake(folder: Path, *arguments: str) -> tuple[int, str]:
    """The exit status and the one line of stderr of `nodbot serve` that is refused."""
    if not (folder / "nodbot.yml").exists():
        good(folder)
    completed = subprocess.run(
        [nodbot(), "serve", "--port", "0", *arguments],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=60,  # a name is looked up at most once; this bounds it all the same
    )
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and completed.stdout == "", completed
    return completed.returncode, lines[0]


@pytest.mark.parametrize("host", ["not a host!", "999.1.1.1", "::zz", "", "exa_mple..com"])
def test_a_malformed_host_is_refused_naming_the_host(tmp_path: Path, host: str) -> None:
    status, said = serve_mistake(tmp_path, "--host", host)
    assert status == 2
    assert said.startswith("nodbot serve: error: argument --host: "), said
    assert f"{host!r} is not a host name or an IP address" in said


def test_a_host_that_does_not_resolve_is_blamed(tmp_path: Path) -> None:
    # `.invalid` never resolves (RFC 6761): refused without asking any DNS server.
    status, said = serve_mistake(tmp_path, "--host", "no-such-host.invalid")
    assert status == 2
    assert said == (
        "nodbot: cannot listen on no-such-host.invalid: the host name does not resolve to an "
        "address; the host came from --host"
    )


def test_an_address_not_of_this_machine_is_blamed(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface here: binding fails at once, nothing is sent.
    status, said = serve_mistake(tmp_path, "--host", "192.0.2.1")
    assert status == 2
    assert said.startswith(
        "nodbot: cannot listen on 192.0.2.1: it is not an address of this machine "
    ), said
    assert said.endswith("; the host came from --host")


def test_a_bad_host_in_the_file_is_a_problem_of_the_file(tmp_path: Path) -> None:
    path = file(tmp_path, "server:\n  host: not a host!\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert refused.value.problems == [
        f"{path}:2: server.host: 'not a host!' is not a host name or an IP address"
    ]
    file(tmp_path, "server:\n  host: no-such-host.invalid\n  port: 0\n")
    status, said = serve_mistake(tmp_path)
    assert status == 2
    assert said.endswith("the host came from server.host of nodbot.yml")
