"""Open any store from one URL, so tools and config files need a single setting.

=============================================  ==================================
``memory://``                                  a new ``MemoryStore``
``sqlite:///relative/path.db``                 ``SqliteStore`` (three slashes: relative)
``sqlite:////absolute/path.db``                ``SqliteStore`` (four slashes: absolute)
``postgresql://user@host:5432/db?schema=x``    ``PostgresStore.connect`` (``schema``
                                               defaults to ``public``; ``postgres://``
                                               works too)
``mysql://user:password@host:3306/db``         ``MySQLStore.connect`` (MariaDB or
                                               MySQL 8; ``mariadb://`` works too)
=============================================  ==================================
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from agent_ledger.errors import EffectLedgerValidationError
from agent_ledger.stores.base import Store

#: Where the CLI and the demo keep their ledger unless told otherwise.
DEFAULT_URL: Final = "sqlite:///./agent_ledger.db"
#: The environment variable that overrides ``DEFAULT_URL``.
URL_ENV: Final = "AGENT_LEDGER_URL"


def default_url() -> str:
    """``$AGENT_LEDGER_URL`` if set, else ``sqlite:///./agent_ledger.db``."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


async def open_store(url: str, *, create: bool = True) -> Store:
    """Open the store ``url`` names (see the module doc). Close it with ``await store.close()``.

    ``create=False`` makes a SQLite URL fail with a clear ``EffectStoreError``
    when the file or its tables do not exist, instead of creating them; a
    PostgreSQL or MySQL store never creates its tables here (``create_schema()`` does).
    """
    if not isinstance(url, str) or "://" not in url:
        raise EffectLedgerValidationError(
            f"not a store URL: {url!r}; expected memory://, sqlite:///PATH, postgresql://... "
            "or mysql://...",
            field="url",
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme == "memory":
        from agent_ledger.stores.memory import MemoryStore

        return MemoryStore()
    if scheme == "sqlite":
        from agent_ledger.stores.sqlite import SqliteStore

        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise EffectLedgerValidationError(
                f"SQLite URL {url!r} names no file; use sqlite:///relative.db or "
                "sqlite:////absolute/path.db",
                field="url",
            )
        return SqliteStore(path, create=create)
    if scheme in ("postgresql", "postgres"):
        try:
            from agent_ledger.stores.postgres import PostgresStore, check_conninfo
        except ImportError:
            raise EffectLedgerValidationError(
                'PostgreSQL URLs need the extra: pip install "agent-ledger[postgres]"',
                field="url",
            ) from None
        conninfo, schema = split_schema(url)
        check_conninfo(conninfo, field="url")
        return await PostgresStore.connect(
            conninfo, schema=schema or "public", connect_timeout=10.0
        )
    if scheme in ("mysql", "mariadb"):
        try:
            from agent_ledger.stores.mysql import MySQLStore
        except ImportError:
            raise EffectLedgerValidationError(
                'MySQL and MariaDB URLs need the extra: pip install "agent-ledger[mysql]"',
                field="url",
            ) from None
        return await MySQLStore.connect(url, connect_timeout=10.0)
    raise EffectLedgerValidationError(
        f"unknown store URL scheme {scheme!r} in {url!r}; "
        "expected memory://, sqlite:///PATH, postgresql://... or mysql://...",
        field="url",
    )


def sqlite_folder(url: str) -> Path | None:
    """The folder a ``sqlite:///`` URL's file lives in, or None for other URLs."""
    if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
        return None
    return Path(url[len("sqlite:///") :]).parent


def split_schema(url: str, *, field: str = "url") -> tuple[str, str | None]:
    """Take our own ``schema`` parameter out of a PostgreSQL URL (libpq would reject it).

    Returns the libpq URL and the schema, None when the URL names none. A URL
    ``urlsplit`` cannot read (``postgresql://[::1``) is an
    ``EffectLedgerValidationError`` naming ``field``, not a ``ValueError``
    from deep inside the standard library.
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise EffectLedgerValidationError(
            f"malformed URL {url!r} ({exc}); expected postgresql://user@host:5432/db?schema=x",
            field=field,
        ) from None
    params = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((value for key, value in params if key == "schema"), None)
    rest = urlencode([(key, value) for key, value in params if key != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema
