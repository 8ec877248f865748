"""Logging and optional OpenTelemetry spans.

Records go to the ``agent_ledger`` logger with ``effect_id``, ``idem_key``,
``tool`` and ``workflow_id`` as record attributes (``extra``), so a JSON log
formatter picks them up. When ``opentelemetry-api`` is importable and the
application has set a tracer provider (``trace.set_tracer_provider``, or the
``OTEL_PYTHON_TRACER_PROVIDER`` variable), ``run()`` is traced as an
``agent_ledger.run`` span; otherwise tracing costs nothing.

The API alone is often installed without anyone tracing (the Anthropic and
MCP SDKs depend on it). Its default provider hands out spans that record
nothing and carry the parent's context unchanged, so starting one would cost
several microseconds per ``run()`` and change nothing anyone can observe:
``span()`` checks whether a provider is set on every call (a provider set
after import counts from then on) and skips the span while none is set. The
check reads the API's provider global, as the API's own proxy tracer does:
``get_tracer_provider()`` would also look up an environment variable on
every call. A provider, once set, stays (the API sets it once), so a yes is
kept. Metrics are in ``agent_ledger.metrics``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from agent_ledger.effects import Effect

logger = logging.getLogger("agent_ledger")


def effect_fields(effect: Effect) -> dict[str, str | None]:
    """The ``extra`` mapping every ledger log record about ``effect`` carries."""
    return {
        "effect_id": effect.id,
        "idem_key": effect.idem_key,
        "tool": effect.tool,
        "workflow_id": effect.workflow_id,
    }


def log_effect(level: int, message: str, effect: Effect) -> None:
    """Log ``message`` about ``effect`` at ``level`` with the effect's fields attached.

    Checks the level first: the engine logs on its hot path, and a disabled
    level must cost no formatting and no dict.
    """
    if logger.isEnabledFor(level):
        logger.log(level, "%s: %s", message, effect.tool, extra=effect_fields(effect))


def _load_trace() -> Any:
    try:
        return importlib.import_module("opentelemetry.trace")
    except ImportError:
        return None


_trace: Any = _load_trace()


def _load_tracer() -> Any:
    if _trace is None:
        return None
    from agent_ledger._version import __version__

    # A proxy until a provider is set: it then delegates to that provider.
    return _trace.get_tracer("agent_ledger", __version__)


_tracer: Any = _load_tracer()
#: The providers that trace nothing: the API's defaults.
_SILENT_PROVIDERS: tuple[type, ...] = (
    (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider) if _trace is not None else ()
)


#: Where the API keeps the global provider (None until one is set); another
#: API layout falls back to ``get_tracer_provider()``.
_PEEK: Final = _trace is not None and hasattr(_trace, "_TRACER_PROVIDER")
#: A recording provider was seen: it cannot be replaced, so spans record from now on.
_traced = False


def tracing() -> bool:
    """Whether a span would record anything: the API is there and a provider is set.

    ``run()`` asks this first and, while it is False, enters no context at all."""
    global _traced
    if _traced:
        return _tracer is not None
    if _tracer is None:
        return False
    provider = _trace._TRACER_PROVIDER if _PEEK else _trace.get_tracer_provider()
    if provider is None or isinstance(provider, _SILENT_PROVIDERS):
        return False
    _traced = True
    return True


_NO_SPAN: Final = nullcontext()


def span(name: str, tool: str, idem_key: str) -> AbstractContextManager[object]:
    """An OpenTelemetry span when a tracer provider is set, else a shared no-op
    context (``run()`` calls this every time: without tracing it allocates nothing)."""
    if not tracing():
        return _NO_SPAN
    return _otel_span(name, {"agent_ledger.tool": tool, "agent_ledger.idem_key": idem_key})


@contextmanager
def _otel_span(name: str, attributes: Mapping[str, str]) -> Iterator[object]:
    with _tracer.start_as_current_span(name, attributes=dict(attributes)) as current:
        yield current
