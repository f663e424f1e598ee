"""The one exception type model loading raises, so the CLI can print it as a single line instead of a traceback."""

from __future__ import annotations


class ModelError(Exception):
    """A model could not be found, assembled, converted or loaded; the message says what to do about it."""
