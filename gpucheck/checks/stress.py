"""Checks of the stress area (see gpucheck/checks/__init__.py)."""

from __future__ import annotations

from gpucheck.checks.check import Check

CHECKS: tuple[Check, ...] = ()
