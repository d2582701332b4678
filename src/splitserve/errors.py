"""The one exception type that reaches users as a single clear line (no traceback)."""


class UserError(Exception):
    """Bad input from the user: a trace row, a name, a count. The message says what to fix."""
