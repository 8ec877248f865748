"""PostgresStore.connect with a wrong URL: fails at once, naming the cause (issue 10, item 19).

A pool keeps retrying a URL that can never work until its timeout and then
raises PoolTimeout, which does not say why; the store connects once directly
first, so the server's own reason reaches the caller.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from agent_ledger import EffectLedgerValidationError, EffectStoreError
from agent_ledger.stores.postgres import PostgresStore


def with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


async def connect_fails(conninfo: str) -> EffectStoreError:
    """Connect with a 20 s budget; the error must come well before it runs out."""
    started = time.monotonic()
    with pytest.raises(EffectStoreError) as info:
        await PostgresStore.connect(conninfo, connect_timeout=20)
    assert time.monotonic() - started < 5, "waited for the pool's timeout"
    assert info.value.operation == "connect"
    assert "PoolTimeout" not in str(info.value)
    return info.value


async def test_a_missing_database_is_named_at_once(dsn: str) -> None:
    """No such database: the server's message, within seconds."""
    name = f"agent_ledger_missing_{uuid.uuid4().hex[:8]}"
    error = await connect_fails(with_database(dsn, name))
    assert f'database "{name}" does not exist' in str(error)


async def test_a_missing_role_is_named_at_once(dsn: str) -> None:
    """No such user: the server's message, within seconds."""
    role = f"agent_ledger_nobody_{uuid.uuid4().hex[:8]}"
    parts = urlsplit(dsn)
    error = await connect_fails(
        urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}"))
    )
    assert f'role "{role}" does not exist' in str(error)


async def test_a_closed_port_is_named_at_once(dsn: str) -> None:
    """Nothing listens on the port: "Connection refused", within seconds."""
    parts = urlsplit(dsn)
    error = await connect_fails(urlunsplit(parts._replace(netloc=f"postgres@{parts.hostname}:1")))
    assert "Connection refused" in str(error)
    assert "\n" not in str(error)  # libpq's hint joined into one line


@pytest.mark.parametrize(
    ("query", "says"),
    [("connect_timeout=soon", "connect_timeout must be a number"),
     ("nosuchparameter=1", 'invalid URI query parameter: "nosuchparameter"')],
)  # fmt: skip
async def test_a_connection_string_libpq_cannot_read_is_refused_before_connecting(
    dsn: str, query: str, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused at once, naming the option (issue 30); no pool ever retries it, so no
    warning a second is logged (a bad connect_timeout got past the probe before)."""
    started = time.monotonic()
    with pytest.raises(EffectLedgerValidationError, match=says) as info:
        await PostgresStore.connect(f"{dsn}{'&' if '?' in dsn else '?'}{query}")
    assert time.monotonic() - started < 2
    assert info.value.field == "conninfo"
    assert not [r for r in caplog.records if r.name.startswith("psycopg")]
