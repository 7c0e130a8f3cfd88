"""The bot, on this machine: `make demo`.

Starts nodbot on a SQLite file with the example support agent, starts a run whose refund of
120.0 pauses for review, and prints a link that signs you in to the web inbox, where you
approve, edit or deny it (or the curl commands that do the same over the HTTP API). When you
have decided, it shows the run finish, and keeps serving (the inbox shows the decision and
the tool's result) until Ctrl-C, when it says it stopped.

    python examples/bot_demo.py                  # you decide, in the inbox or with curl
    python examples/bot_demo.py --auto edit      # it decides for you (approve, edit, deny),
                                                 # and ends once the run has finished
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import httpx

from nodbot.bot.serve import serving

ROOT = Path(__file__).resolve().parents[1]
REVIEWER = "demo-lead@example.com"

CONFIG = """\
store: {{url: "sqlite:///{folder}/nodbot.db"}}
server: {{host: 127.0.0.1, port: {port}}}
web:
  secret: "{web_secret}"
api:
  tokens:
    - name: {reviewer}
      token: {token}
      scopes: [runs:write, approvals:read, approvals:decide]
agents:
  support: examples.support_agent:agent
rules:
  - tool: refund
    when: {{gt: {{amount: 100}}}}
    description: Refunds over 100 need a support lead.
    reviewers: [{reviewer}]
    allow_self_approval: true
    editable: [amount]
"""

ANSWERS: dict[str, dict[str, Any]] = {
    "approve": {"action": "approve"},
    "edit": {"action": "edit", "arguments": {"amount": 100.0}},
    "deny": {"action": "deny", "reason": "refund policy: at most 100 without a receipt"},
}


def instructions(url: str, token: str, approval_id: str, link: str) -> str:
    decide = (
        f"curl -s -X POST {url}/approvals/{approval_id}/decide -H 'Authorization: Bearer {token}'"
    )
    return "\n".join(
        [
            f"The refund waits for you. Open the inbox (signed in as {REVIEWER}) to decide it:",
            f"  {link}",
            "Or decide it over the HTTP API with one of:",
            f'  approve: {decide} -d \'{{"action": "approve"}}\'',
            f'  edit:    {decide} -d \'{{"action": "edit", "arguments": {{"amount": 100}}}}\'',
            f'  deny:    {decide} -d \'{{"action": "deny", "reason": "not without a receipt"}}\'',
            f"See it:    curl -s {url}/approvals/{approval_id} -H 'Authorization: Bearer {token}'",
        ]
    )


async def demo(auto: str | None, port: int, keep_serving: bool) -> None:
    token = secrets.token_urlsafe(16)
    web_secret = secrets.token_urlsafe(24)  # signs the inbox's links; new at each start
    headers = {"Authorization": f"Bearer {token}"}
    with tempfile.TemporaryDirectory(prefix="nodbot-demo-") as folder:
        config = Path(folder) / "nodbot.yml"
        config.write_text(
            CONFIG.format(
                folder=folder, port=port, reviewer=REVIEWER, token=token, web_secret=web_secret
            )
        )
        async with serving(str(config)) as bot, httpx.AsyncClient(base_url=bot.url) as client:
            print(f"nodbot is serving {bot.url} (store {bot.store_url})")
            # Requested by the token's name: the demo's one person asks and decides (the
            # rule allows self-approval); naming someone else needs runs:write-as.
            body = {"agent": "support", "input": "Refund order A-1001"}
            run = (await client.post("/runs", json=body, headers=headers)).json()
            [pending] = run["pending"]
            print(f"Run {run['run_id']} asks: {pending['tool']} {pending['arguments']}")
            if auto is None:
                link = bot.sign_in_link(REVIEWER)  # signed with the secret the bot uses
                print(instructions(bot.url, token, pending["approval_id"], link), flush=True)
            else:
                print(f"Deciding it: {auto}")
                decide = f"/approvals/{pending['approval_id']}/decide"
                await client.post(decide, json=ANSWERS[auto], headers=headers)
            while True:
                run = (await client.get(f"/runs/{run['run_id']}", headers=headers)).json()
                if run["status"] in ("finished", "failed"):
                    break
                await asyncio.sleep(0.1)
            approval = (
                await client.get(f"/approvals/{pending['approval_id']}", headers=headers)
            ).json()
            decision = approval["decision"]
            print(f"Decided by {decision['decided_by']}: {approval['status']}")
            for result in run["tool_results"]:
                ran = f"ran with {result['arguments']}" if result["arguments"] else "did not run"
                print(f"The {result['tool']} {ran}: {result['content']}")
            print(f"Run {run['run_id']} {run['status']}: {run['final_text'] or run['error']}")
            if keep_serving:
                print(f"nodbot keeps serving {bot.url} until Ctrl-C", flush=True)
                await asyncio.shield(bot.stopped)  # done when Ctrl-C (or SIGTERM) stops it
    print("nodbot stopped (the demo's store is gone with its folder)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--auto", choices=sorted(ANSWERS), help="decide without a person")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--keep-serving",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve on once the run has finished, until Ctrl-C (the default without --auto)",
    )
    arguments = parser.parse_args()
    keep = arguments.keep_serving if arguments.keep_serving is not None else not arguments.auto
    os.chdir(ROOT)  # where examples.support_agent is imported from
    try:
        asyncio.run(demo(arguments.auto, arguments.port, keep))
    except KeyboardInterrupt:
        print("nodbot stopped", flush=True)


if __name__ == "__main__":
    main()
