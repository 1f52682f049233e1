"""The user's mistakes, as exceptions the command line reports in one line.

A bad setting, a missing file or malformed data is the user's to fix: `meta-agent` prints the message
(which names the key, path or line and what to do) and exits 2. Every other exception is a bug and keeps
its traceback. The classes also derive from the builtin a caller would expect (ValueError,
FileNotFoundError), so library callers can catch those.
"""

from __future__ import annotations


class UserError(Exception):
    """Something the user asked for cannot be done as asked; the message says what to change."""


class SettingError(UserError, ValueError):
    """A config key has a value the code cannot run with."""


class MissingFile(UserError, FileNotFoundError):
    """A file or folder the config names does not exist."""


class BadData(UserError, ValueError):
    """A data file (tasks, demonstrations) holds a row the code cannot read; the message names file and line."""
