"""`nodbot audit verify|export` (and `migrate --key-env`) end to end, on SQLite and
PostgreSQL; and the API showing who an event's actor is."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from nodbot.bot.cli.commands import main
from nodbot.bot.config import ConfigError, load_config
from nodbot.core.audit import EventHasher
from nodbot.core.sqlstore.audit import verify
from tests.bot.test_cli import nodbot
from tests.bot.test_http_approvals import auth, served
from tests.core.store.conftest import database_url
from tests.core.store.test_audit import KEY, Database, old_history, recorded

ROOT = Path(__file__).resolve().parents[2]
SQL_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def audit(*words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nodbot(), "audit", *words], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env
    )


def write_config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "nodbot.yml"
    path.write_text(f'store: {{url: "{url}"}}\naudit: {{key: "${{NODBOT_AUDIT_KEY}}"}}\n')
    return path


async def remove_a_vote(url: str, approval_id: str) -> tuple[int, int]:
    """Delete the first `voted` event of a review with plain SQL; the (seq, n) after it."""
    async with Database(url) as db:
        chain = await db.events(approval_id)
        index = next(i for i, event in enumerate(chain) if event[2] == "voted")
        await db.lift_append_only()
        await db.fetch("DELETE FROM events WHERE seq = ?", chain[index][0])
    seq, n, _, _ = chain[index + 1]
    return seq, n


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_verify_says_ok_then_names_what_was_removed(backend: str, tmp_path: Path) -> None:
    async with database_url(backend, tmp_path) as url:
        story = await recorded(url)
        passed = await asyncio.to_thread(audit, "verify", "--store", url)
        assert (passed.returncode, passed.stderr) == (0, "")
        assert passed.stdout == "ok: 24 events in 5 reviews\n"

        seq, n = await remove_a_vote(url, story.quorum)
        failed = await asyncio.to_thread(audit, "verify", "--store", url)
    assert failed.returncode == 1, failed.stderr
    lines = failed.stdout.splitlines()
    assert lines[0] == (
        f"{story.quorum}: event {seq} (n={n}, refused): the events n={n - 1} are missing "
        f"(it follows n={n - 2}): removed"
    )
    assert lines[1].startswith(f"{story.quorum}: the approval has 2 votes but its chain holds 1")
    assert lines[2] == "2 problems in 23 events in 5 reviews"


def test_verify_with_the_files_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'nodbot.db'}"
    asyncio.run(recorded(url, KEY))
    config = str(write_config(tmp_path, url))
    monkeypatch.setenv("NODBOT_AUDIT_KEY", KEY)
    monkeypatch.setenv("WRONG_KEY", "not the key, but long")
    assert main(["audit", "verify", "--config", config]) == 0
    assert main(["audit", "verify", "--config", config, "--key-env", "WRONG_KEY"]) == 1
    assert main(["audit", "verify", "--store", url]) == 1  # no key: every hash differs
    assert main(["audit", "verify", "--store", url, "--key-env", "NODBOT_AUDIT_KEY"]) == 0


def test_verify_problems_and_errors_print_as_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'nodbot.db'}"
    asyncio.run(recorded(url, KEY))
    capsys.readouterr()
    assert main(["audit", "verify", "--store", url]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        "24 problems in 24 events in 5 reviews",
        "no audit key was given: if the store has one, pass it (--key-env NAME, or audit.key "
        "of the file with --config)",
    ]
    monkeypatch.delenv("UNSET_KEY", raising=False)
    assert main(["audit", "verify", "--store", url, "--key-env", "UNSET_KEY"]) == 2
    assert capsys.readouterr().err == (
        "nodbot: the environment variable UNSET_KEY (--key-env) is not set\n"
    )
    missing = tmp_path / "missing.db"
    assert main(["audit", "verify", "--store", f"sqlite:///{missing}"]) == 1
    assert capsys.readouterr().err == f"nodbot: there is no database at {missing}\n"
    assert not missing.exists()


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_export_writes_every_event_oldest_first(backend: str, tmp_path: Path) -> None:
    output = tmp_path / "events.jsonl"
    async with database_url(backend, tmp_path) as url:
        story = await recorded(url, KEY)
        done = await asyncio.to_thread(audit, "export", "--store", url, "--output", str(output))
        assert (done.returncode, done.stdout) == (0, f"24 events written to {output}\n")
        to_stdout = await asyncio.to_thread(audit, "export", "--store", url)
    assert to_stdout.stdout == output.read_text(encoding="utf-8")
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 24 and [row["seq"] for row in rows] == sorted(row["seq"] for row in rows)
    assert set(rows[0]) == {
        "seq",
        "approval_id",
        "n",
        "kind",
        "at",
        "actor",
        "person",
        "channel",
        "detail",
        "prev",
        "hash",
    }
    [voted] = [r for r in rows if r["approval_id"] == story.single and r["kind"] == "voted"]
    assert voted["person"] == "person:zoe" and json.loads(voted["detail"])["action"] == "edit"
    # The export alone is enough to check every hash again.
    hasher = EventHasher(KEY)
    for row in rows:
        fields = {name: row[name] for name in row if name not in ("seq", "hash", "at")}
        at = datetime.fromisoformat(row["at"])  # UTC, as the hash has it
        assert hasher.hash(**fields, at=at) == row["hash"]


@pytest.mark.parametrize("backend", SQL_BACKENDS)
async def test_migrate_chains_the_old_events_with_the_key(backend: str, tmp_path: Path) -> None:
    async with database_url(backend, tmp_path) as url:
        await old_history(url)
        env = {**os.environ, "NODBOT_AUDIT_KEY": KEY}
        migrated = await asyncio.to_thread(
            subprocess.run,
            [nodbot(), "migrate", "--store", url, "--key-env", "NODBOT_AUDIT_KEY"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            env=env,
        )
        assert migrated.returncode == 0, migrated.stderr
        assert (await verify(url, KEY)).summary() == "ok: 8 events in 2 reviews"


async def test_the_api_shows_the_person_of_an_event(tmp_path: Path) -> None:
    async with served("sqlite", tmp_path) as api:
        _, _, approval_id = await api.pending("run_1")
        await api.store.refuse(
            approval_id,
            actor="U0999",
            channel="slack",
            reason="not a reviewer",
            person="slack:U0999",
            evidence={"user": "U0999"},
        )
        response = await api.client.get(f"/approvals/{approval_id}", headers=auth("reader"))
    assert response.status_code == 200, response.text
    events = response.json()["events"]
    assert [(e["kind"], e["actor"], e["person"]) for e in events] == [
        ("created", "carl", None),
        ("refused", "U0999", "slack:U0999"),
    ]
    assert events[1]["detail"] == {"reason": "not a reviewer", "evidence": {"user": "U0999"}}


def test_the_audit_key_comes_from_the_environment_and_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file = write_config(tmp_path, f"sqlite:///{tmp_path / 'nodbot.db'}")
    monkeypatch.setenv("NODBOT_AUDIT_KEY", KEY)
    config = load_config(config_file)
    assert config.audit.secret == KEY and KEY not in repr(config.audit)
    monkeypatch.setenv("NODBOT_AUDIT_KEY", "short")
    with pytest.raises(ConfigError) as caught:
        load_config(config_file)
    assert "audit.key" in str(caught.value) and "16" in str(caught.value)
    assert "short" not in str(caught.value)
    assert load_config(write_config_without_audit(tmp_path)).audit.secret is None


def write_config_without_audit(tmp_path: Path) -> Path:
    path = tmp_path / "plain.yml"
    path.write_text(f'store: {{url: "sqlite:///{tmp_path / "nodbot.db"}"}}\n')
    return path
