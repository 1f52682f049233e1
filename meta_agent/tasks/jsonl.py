"""Reading JSON-lines task files: each row with its line number, a broken line named by file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from meta_agent.errors import BadData

# The longest row read, in bytes. No task this project reads comes near it (a question the backbone can
# read whole is at most its context, tens of KB); a longer row is refused as it is read, before it is
# parsed, tokenized or batched.
MAX_ROW_BYTES = 1_000_000


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row) of each non-blank line of `path`; BadData naming `path:line` for a
    line that is not UTF-8, longer than MAX_ROW_BYTES or not JSON."""
    with path.open("rb") as f:
        for line_no, raw in enumerate(iter(lambda: f.readline(MAX_ROW_BYTES + 1), b""), start=1):
            if len(raw.rstrip(b"\n")) > MAX_ROW_BYTES:
                raise BadData(
                    f"{path}:{line_no}: the row is longer than {MAX_ROW_BYTES:,} bytes, far beyond what the "
                    "model can read: shorten it or drop it from the file"
                )
            line = decoded(raw, path, line_no)
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise BadData(f"{path}:{line_no}: not valid JSON ({e.msg}); is the file complete?") from e


def decoded(raw: bytes, path: Path, line_no: int) -> str:
    """One line of `path` as text; BadData naming the line and column of a byte that is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadData(
            f"{path}:{line_no}: byte 0x{raw[e.start]:02x} at column {e.start + 1} is not UTF-8: save the file "
            "as UTF-8"
        ) from None
