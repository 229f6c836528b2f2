"""The one exception type a user ever sees from bad input."""
from __future__ import annotations


class CopeInputError(ValueError):
    """Bad input: a file, field or argument that does not meet its contract.

    The message is a single line naming where the problem is (file and field when known),
    what was found and what was expected. The CLI prints it and exits with status 2; the app
    shows it with ``st.error``.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        parts = []
        if source:
            parts.append(str(source))
        if field:
            parts.append(f"field '{field}'")
        prefix = ": ".join(parts)
        text = f"{prefix}: {message}" if prefix else message
        super().__init__(" ".join(text.split()))  # always one line
        self.source = source
        self.field = field
        self.detail = message


class UnsupportedByRuntime(CopeInputError):
    """A runtime that cannot run this model (or this placement of it) at all, e.g. a family it
    has no model class for: still a one-line input error on the command line, but the app shows
    it as information about that runtime rather than as a mistake of the user's."""
