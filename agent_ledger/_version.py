"""The single place the package version lives."""

from __future__ import annotations

__version__ = "0.3.0"
