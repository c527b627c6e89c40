"""The one error type the invoke tasks turn into a one-line exit."""

from __future__ import annotations


class UserError(RuntimeError):
    """A problem the user can fix (no daemon, no image, no dataset, no device)."""
