"""Make the Teams app package: manifest.json (its {{APP_ID}}, {{HOST}} and {{ORGANIZATION}}
filled in) and the two icons, zipped, to upload in Teams (Apps, Manage your apps, Upload an
app) or in the Teams admin center.

    python deploy/teams/make_package.py --app-id <Microsoft app id> --host bot.example.com \
        --organization "Example Ltd" --out nodbot-teams.zip

The icons are plain squares in the manifest's accent colour (192x192 colour, 32x32 white
outline on transparent), made here so that the recipe needs nothing but Python; replace them
with your own by passing --color and --outline.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import zipfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
GUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
HOST = re.compile(r"[A-Za-z0-9.-]+(:[0-9]+)?")


def png(size: int, rgba: tuple[int, int, int, int]) -> bytes:
    """A square PNG of one colour."""
    row = b"\x00" + bytes(rgba) * size
    raw = zlib.compress(row * size)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def manifest(app_id: str, host: str, organization: str) -> dict[str, object]:
    """The manifest with its placeholders filled in. Raises ValueError for a value that is
    not an app id (a GUID) or a host name."""
    if not GUID.fullmatch(app_id):
        raise ValueError(f"the app id is a GUID, not {app_id!r}")
    if not HOST.fullmatch(host):
        raise ValueError(f"expected a host name such as bot.example.com, not {host!r}")
    text = (HERE / "manifest.json").read_text()
    values = {"APP_ID": app_id, "HOST": host, "ORGANIZATION": organization}
    # Filled into the parsed JSON's strings, so a value cannot change its structure.
    found: dict[str, object] = json.loads(text, object_hook=lambda d: _fill(d, values))
    return found


def _fill(node: dict[str, object], values: dict[str, str]) -> dict[str, object]:
    def filled(value: object) -> object:
        if isinstance(value, str):
            for name, text in values.items():
                value = value.replace("{{" + name + "}}", text)
            return value
        if isinstance(value, list):
            return [filled(item) for item in value]
        return value

    return {key: filled(value) for key, value in node.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make the nodbot Teams app package.")
    parser.add_argument("--app-id", required=True, help="the Azure bot's Microsoft app id")
    parser.add_argument("--host", required=True, help="where Teams reaches the bot")
    parser.add_argument("--organization", default="nodbot", help="the developer's name")
    parser.add_argument("--color", type=Path, help="a 192x192 PNG icon")
    parser.add_argument("--outline", type=Path, help="a 32x32 white-on-transparent PNG icon")
    parser.add_argument("--out", type=Path, default=Path("nodbot-teams.zip"))
    options = parser.parse_args(argv)
    found = manifest(options.app_id, options.host, options.organization)
    color = options.color.read_bytes() if options.color else png(192, (47, 85, 151, 255))
    outline = options.outline.read_bytes() if options.outline else png(32, (255, 255, 255, 255))
    with zipfile.ZipFile(options.out, "w", zipfile.ZIP_DEFLATED) as package:
        package.writestr("manifest.json", json.dumps(found, indent=2))
        package.writestr("color.png", color)
        package.writestr("outline.png", outline)
    print(f"{options.out}: manifest.json, color.png, outline.png")


if __name__ == "__main__":
    main()
