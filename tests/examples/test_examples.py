"""The examples run offline and print exactly what the documentation shows."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, str(ROOT / "examples" / "bot_demo.py")]
REVIEWER = "demo-lead@example.com"
SEED = ROOT.parent / "shared" / "seeds" / "003_2bea4f8f8fc09860.txt"

# The Output block of the "Human in the loop" document (003), byte for byte.
HOWTO_OUTPUT = """\
refunded 20.0 on o-1
pending approval-pending
refund {'order_id': 'o-7', 'amount': 500.0}
first decision wins
ok refunded 450.0 on o-7
True
pending True
error approval denied for tool 'refund': refund policy: max 500
[20.0, 450.0]
"""

# The refund edit scenario of "Pause for approval" (000), with nodbot's own API: the run
# pauses, the reviewer edits 120.0 down to 100.0, and the refund runs once with 100.0.
REFUND_EDIT_OUTPUT = """\
pending
approve_call_1 refund {'order_id': 'A-1001', 'amount': 120.0}
stop
{"result":"refunded 100.0 on A-1001"}
The refund is done.
"""


def run_example(name: str) -> str:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        check=True,
        cwd=ROOT,
        timeout=60,
    )
    assert completed.stderr == b""
    return completed.stdout.decode("utf-8")


def test_howto_hitl_reproduces_the_documented_output() -> None:
    assert run_example("howto_hitl.py") == HOWTO_OUTPUT


def test_the_expected_output_is_the_seed_documents_own() -> None:
    if not SEED.exists():
        pytest.skip(f"the source documents are not beside the checkout ({SEED})")
    assert HOWTO_OUTPUT in SEED.read_text(encoding="utf-8").replace("\r\n", "\n")


def test_refund_edit_runs_the_edited_refund_once() -> None:
    assert run_example("refund_edit.py") == REFUND_EDIT_OUTPUT


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("approve", "The refund ran with {'order_id': 'A-1001', 'amount': 120.0}"),
        ("edit", "The refund ran with {'order_id': 'A-1001', 'amount': 100.0}"),
        ("deny", 'The refund did not run: {"error":"approval denied for tool \'refund\': '),
    ],
)
def test_the_bot_demo_pauses_the_refund_and_finishes_after_the_decision(
    answer: str, expected: str
) -> None:
    completed = subprocess.run(
        [*DEMO, "--auto", answer, "--port", "0"],
        capture_output=True,
        check=True,
        cwd=ROOT,
        timeout=60,
        text=True,
    )
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("nodbot is serving http://127.0.0.1:")
    assert lines[1].endswith("asks: refund {'amount': 120.0, 'order_id': 'A-1001'}")
    assert any(line.startswith(expected) for line in lines), completed.stdout
    # Decided over the HTTP API, though the review was emailed too.
    assert any(line.startswith(f"Decided by {REVIEWER} (channel api): ") for line in lines)
    assert lines[-2].split(": ", 1)[0].endswith("finished")
    assert lines[-1].startswith("nodbot stopped")


@dataclass
class Demo:
    """What the demo printed until it kept serving, and after Ctrl-C."""

    lines: list[str] = field(default_factory=list)
    url: str = ""
    rest: str = ""
    returncode: int | None = None


@contextlib.contextmanager
def demo_serving(answer: str) -> Iterator[Demo]:
    """The demo with `--auto answer --keep-serving`, once it says it keeps serving; after the
    block it gets Ctrl-C (SIGINT) and the demo's last output and exit status are read."""
    process = subprocess.Popen(
        [*DEMO, "--auto", answer, "--port", "0", "--keep-serving"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    demo = Demo()
    try:
        assert process.stdout is not None
        while not (line := process.stdout.readline()).startswith("nodbot keeps serving"):
            assert line, f"the demo ended: {''.join(demo.lines)}{process.communicate()[1]}"
            demo.lines.append(line.rstrip("\n"))
        demo.url = line.split()[3]
        yield demo
        process.send_signal(signal.SIGINT)
        demo.rest, _ = process.communicate(timeout=30)
        demo.returncode = process.returncode
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def test_the_bot_demo_keeps_serving_until_ctrl_c_and_says_it_stopped() -> None:
    with demo_serving("approve") as demo:
        assert httpx.get(f"{demo.url}/healthz", timeout=10).status_code == 200  # still serving
    assert demo.rest.splitlines()[-1].startswith("nodbot stopped"), demo.rest
    assert demo.returncode == 0


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_bot_demo_stopped_while_it_waits_for_a_person_says_so(stop: signal.Signals) -> None:
    process = subprocess.Popen(
        [*DEMO, "--port", "0"],  # no --auto: the refund waits for a person
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        printed = []
        while not (line := process.stdout.readline()).startswith("  curl -s smtp://"):
            assert line, f"the demo ended: {''.join(printed)}{process.communicate()[1]}"
            printed.append(line)
        process.send_signal(stop)
        rest, errors = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "Traceback" not in errors, errors
    assert rest.splitlines()[-1].startswith("nodbot stopped"), rest
    assert process.returncode == 0


def test_the_bot_demo_emails_the_review_and_approves_it_by_reply() -> None:
    with demo_serving("email") as demo:
        printed = "\n".join(demo.lines)
        arrived = f"The review's email to {REVIEWER} arrived: cat "
        [path] = [Path(line[len(arrived) :]) for line in demo.lines if line.startswith(arrived)]
        # Read while the demo serves: its folder goes when it stops.
        message = message_from_bytes(path.read_bytes(), policy=policy.default)
        assert message["To"] == REVIEWER
        assert "refund" in message["Subject"], message["Subject"]
    assert f"Decided by {REVIEWER} (channel email): approved" in demo.lines, printed
    ran = "The refund ran with {'order_id': 'A-1001', 'amount': 120.0}: "
    assert any(line.startswith(ran) for line in demo.lines), printed
    assert demo.lines[-1].split(": ", 1)[0].endswith("finished"), printed
    assert demo.rest.splitlines()[-1].startswith("nodbot stopped"), demo.rest
    assert demo.returncode == 0
