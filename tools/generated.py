"""A file the repository generates: written by `write`, and `check` fails
while the committed file differs from what would be written (make lint and
make rules-check run the checks)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_or_check(mode: str, out: Path, text: str, source: str, remake: str) -> int:
    """`mode` "write" writes `text` to `out`; "check" compares. `source`
    names what it is made from, `remake` the command that makes it."""
    name = out.relative_to(ROOT)
    if mode == "write":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {name}")
        return 0
    if not out.exists() or out.read_text() != text:
        print(f"{name} is not what {source} makes: run {remake}", file=sys.stderr)
        return 1
    print(f"{name} matches {source}")
    return 0
