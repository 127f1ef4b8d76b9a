"""The one exception softeval raises for problems a user can fix."""


class SoftevalError(Exception):
    """A user-facing error: the message names the problem and the fix, on one line."""
