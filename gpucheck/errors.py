"""Errors that end a command with a one-line message."""


class UsageError(Exception):
    """Bad input from the user: one line saying what to do, exit code 2."""
