"""An agent in a process of its own for `test_client.py`: it guards a refund with
`SyncApprovalClient.guard` and calls it once; the refund appends a line to a file.

    python tests/bot/client_process.py URL RUN_ID LEDGER      (the token in NODBOT_CLIENT_TOKEN)

It prints what the refund returned, or `denied: <reason>`, and exits 0 either way (1 on a
timeout, 2 on any other error of the client)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from nodbot.core.client import ApprovalClientError, CallDenied, DecisionTimeout, SyncApprovalClient


def main(url: str, run_id: str, ledger: Path) -> int:
    with SyncApprovalClient(url, token=os.environ["NODBOT_CLIENT_TOKEN"]) as nodbot:

        @nodbot.guard(run_id=run_id, within=30)
        def refund(order_id: str, amount: float) -> str:
            with ledger.open("a") as file:
                file.write(json.dumps({"order_id": order_id, "amount": amount}) + "\n")
            return f"refunded {amount} on {order_id}"

        try:
            print(refund("o-7", amount=500), flush=True)
        except CallDenied as denied:
            print(f"denied: {denied.reason}", flush=True)
        except DecisionTimeout as exc:
            print(f"timeout: {exc}", file=sys.stderr)
            return 1
        except ApprovalClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
