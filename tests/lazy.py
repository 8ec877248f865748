"""Modules imported on first use, so collecting a test module costs no SDK import.

Every xdist worker collects every test module: a framework SDK imported at a
test module's top is paid by each worker (the Anthropic SDK's types alone are
about 2 CPU-s), even by workers that never run one of its tests. A test module
names such a module with ``lazy`` instead; the import happens on the first
attribute read, inside a test. Type checkers see the real module::

    if TYPE_CHECKING:
        import anthropic.types as anthropic_types
    else:
        anthropic_types = lazy("anthropic.types")

Only public names (no leading underscore) are read through it.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module ``name`` and imports it when an attribute is read."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("_"):
            # Collection probes every module-level object (pytest reads
            # __test__, __wrapped__, _mock_name...): none of them imports.
            # So only public names resolve through the proxy.
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy(name: str) -> Any:
    """The module ``name``, imported on first attribute access."""
    return LazyModule(name)
