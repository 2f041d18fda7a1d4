"""The one exception type for errors a user can fix, and the process exit codes."""

from __future__ import annotations

# pre-commit's convention: distinct codes for "you can fix this", "we have a bug" and Ctrl-C.
EXIT_OK = 0
EXIT_USER_ERROR = 1
EXIT_BUG = 3
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Something the user can fix. The message is one line: what, which thing, and the fix."""

    def __init__(self, message: str, exit_code: int = EXIT_USER_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code
