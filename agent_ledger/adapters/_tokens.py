"""Token counts read from the SDKs' responses, by one rule for every adapter.

The SDKs build responses leniently from the provider's JSON, so a count can
be missing, null, a float or nonsense. The rule, the same for OpenAI and
Anthropic:

* a response without usage, or a count that is missing or null, counts as
  0 tokens, with a warning: the call is recorded, and the log says its
  tokens were not reported (a stream that did not ask for usage);
* a whole number, even written as a float (``12.0``), is that count;
* anything else (``5.5``, a negative number, a string) is an
  ``EffectLedgerValidationError``. Raised inside ``read=``, it does not
  lose the paid call: ``ledger.llm()`` records the call failed, at its
  estimate (``docs/budgets.md``).
"""

from __future__ import annotations

import logging

from agent_ledger.effects import Usage
from agent_ledger.errors import EffectLedgerValidationError

logger = logging.getLogger("agent_ledger")


def token_count(value: object, *, sdk: str, name: str) -> int:
    """``value``, a token count the ``sdk`` response reported as ``name``, checked."""
    if value is None:
        logger.warning("%s response reported no %s: counted as 0 tokens", sdk, name)
        return 0
    if type(value) is int and value >= 0:
        return value
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    raise EffectLedgerValidationError(
        f"{sdk} response reported {name}={value!r}, which is not a token count (a whole "
        "number >= 0)",
        field=name,
    )


def no_usage(sdk: str) -> Usage:
    """The usage of a response that reported none: 0 tokens, with a warning."""
    logger.warning("%s response has no usage: counted as 0 tokens", sdk)
    return Usage()
