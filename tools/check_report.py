"""What a repository check says at its end (tools/check_*.py): each
problem on a line of its own, then a summary; exit status 1 if there was
any."""

import sys


def report(problems: list[str], failed: str, passed: str) -> None:
    """Prints each of `problems`; if there is any, `failed` and exit status
    1, else `passed`."""
    for p in problems:
        print(p)
    if problems:
        print(failed)
        sys.exit(1)
    print(passed)
