"""Reading JSON-lines task files: each row with its line number, a broken line named by file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from meta_agent.errors import BadData


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row) of each non-blank line of `path`; BadData naming `path:line` for a
    line that is not JSON."""
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise BadData(f"{path}:{line_no}: not valid JSON ({e.msg}); is the file complete?") from e
