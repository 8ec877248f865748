"""PostgresStore's roles and separation of duty (``postgres_roles.sql``), opt-in.

``install_roles`` applies the file in one transaction: three NOLOGIN group
roles (owner, worker, approver), their grants, the owner as owner of every
ledger object in the schema, and the triggers that make PostgreSQL itself
refuse a decision by anyone but an approver (SQLSTATE 42501), record the
decider and the requester from the session, and, when asked, refuse a
decision by the identity that requested it. Not a schema version: the
tables do not change, and it is applied again after every upgrade.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any, Final, LiteralString

from psycopg import sql

from agent_ledger.errors import EffectLedgerValidationError, EffectStoreError
from agent_ledger.stores import _postgres_queries as q
from agent_ledger.stores._postgres_approvals import ATTEMPTS_TABLE, LINKS_TABLE
from agent_ledger.stores._postgres_budgets import BUDGETS_TABLE, CHARGES_TABLE, HOLDS_TABLE
from agent_ledger.stores._postgres_partitions import KEYS_TABLE
from agent_ledger.stores._postgres_sagas import SAGAS_TABLE, STEPS_TABLE
from agent_ledger.stores._postgres_tables import PostgresTables

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from psycopg_pool import AsyncConnectionPool

__all__ = ["DEFAULT_ROLE_PREFIX", "LedgerRoles", "PostgresRoles", "role_names"]

#: The roles' names are this prefix followed by ``owner``, ``worker``, ``approver``.
DEFAULT_ROLE_PREFIX: Final = "agent_ledger_"
#: The settings table (one row) the triggers read.
ROLES_TABLE: Final = "agent_ledger_roles"
#: The file, with ``{name}`` placeholders filled by ``psycopg.sql``.
ROLES_SQL: Final[LiteralString] = (
    resources.files("agent_ledger.stores").joinpath("postgres_roles.sql").read_text("utf-8")
)
_APPROVALS_TABLE: Final = "agent_ledger_approvals"
_EFFECTS_TABLE: Final = "agent_ledger_effects"
#: A prefix is lowercase letters, digits and underscores, starting with a letter
#: or underscore, so the roles need no quoting in a GRANT a person types.
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]*")
#: PostgreSQL's identifier limit (bytes) minus the longest suffix, "approver".
_MAX_PREFIX: Final = 63 - len("approver")


@dataclass(frozen=True, slots=True)
class LedgerRoles:
    """The role set of a schema: the three group roles' names, and whether the
    database refuses a decision by the identity that requested it."""

    owner: str
    worker: str
    approver: str
    separate_duty: bool


def role_names(prefix: str = DEFAULT_ROLE_PREFIX) -> tuple[str, str, str]:
    """``(owner, worker, approver)`` for ``prefix``; a clear error for a bad prefix."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix) or len(prefix) > _MAX_PREFIX:
        raise EffectLedgerValidationError(
            f"role prefix must be 1 to {_MAX_PREFIX} lowercase letters, digits or underscores, "
            f"starting with a letter or underscore (e.g. {DEFAULT_ROLE_PREFIX!r}), got {prefix!r}",
            field="role_prefix",
        )
    return prefix + "owner", prefix + "worker", prefix + "approver"


class PostgresRoles(PostgresTables):
    """Mixed into ``PostgresStore``: the opt-in role set of ``postgres_roles.sql``."""

    if TYPE_CHECKING:
        _pool: AsyncConnectionPool[Any]
        _wants_partitioned: bool | None
        _partitioned: bool | None

        def _errors(
            self, operation: str, *, idem_key: str | None = None, effect_id: str | None = None
        ) -> AbstractContextManager[None]: ...

        def _init_command(self) -> str: ...

    def _roles_names(self) -> dict[str, sql.Composable]:
        def table(name: str) -> sql.Identifier:
            return sql.Identifier(self.schema, name)

        quoted = '"' + self.schema.replace('"', '""') + '"'

        def qualified(name: str) -> sql.Literal:
            # Text a regclass or regprocedure cast resolves: "schema".name.
            return sql.Literal(f"{quoted}.{name}")

        return {
            "schema": sql.Identifier(self.schema),
            "schema_name": sql.Literal(self.schema),
            "settings": table(ROLES_TABLE),
            "effects": table(_EFFECTS_TABLE),
            "approvals": table(_APPROVALS_TABLE),
            "attempts": table(ATTEMPTS_TABLE),
            "links": table(LINKS_TABLE),
            "budgets": table(BUDGETS_TABLE),
            "holds": table(HOLDS_TABLE),
            "charges": table(CHARGES_TABLE),
            "sagas": table(SAGAS_TABLE),
            "steps": table(STEPS_TABLE),
            "keys_name": qualified(KEYS_TABLE),
            "effects_name": qualified(_EFFECTS_TABLE),
            "add_partitions_name": qualified(
                "agent_ledger_add_partitions(timestamptz, timestamptz)"
            ),
            "identity": table("agent_ledger_session_identity"),
            "guard": table("agent_ledger_guard_decision"),
            "insert_guard": table("agent_ledger_guard_new_effect"),
            "stamp": table("agent_ledger_stamp_requester"),
            "record_request": table("agent_ledger_record_request"),
            "appended": table("agent_ledger_history_appended"),
            "guard_key_delete": table("agent_ledger_guard_key_delete"),
            "keys": table(KEYS_TABLE),
        }

    async def install_roles(
        self, *, prefix: str = DEFAULT_ROLE_PREFIX, separate_duty: bool | None = None
    ) -> LedgerRoles:
        """Create (or bring up to date) the role set and its triggers in this schema.

        ``prefix`` names the roles (``<prefix>owner``, ``<prefix>worker``,
        ``<prefix>approver``; default ``agent_ledger_``). ``separate_duty``:
        True makes the database refuse a decision by the identity that
        requested it, False allows it, None keeps what the schema has (off
        at first). Idempotent: run it again after every upgrade. Needs a
        role that may create roles and owns the tables (a superuser, or the
        tables' owner with CREATEROLE); the tables must exist
        (``create_schema()`` first). Returns what is now installed.
        """
        owner, worker, approver = role_names(prefix)
        if separate_duty is not None and not isinstance(separate_duty, bool):
            raise EffectLedgerValidationError(
                f"separate_duty must be True, False or None, got {separate_duty!r}",
                field="separate_duty",
            )
        names = self._roles_names()
        text = sql.SQL(ROLES_SQL).format(
            owner=sql.Identifier(owner),
            worker=sql.Identifier(worker),
            approver=sql.Identifier(approver),
            owner_name=sql.Literal(owner),
            worker_name=sql.Literal(worker),
            approver_name=sql.Literal(approver),
            **names,
        )
        params = {
            "owner": owner,
            "worker": worker,
            "approver": approver,
            "separate_duty": separate_duty,
        }
        with self._errors("install_roles"):
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute(q.ROLES_LOCK)
                cursor = await conn.execute(
                    q.HAS_VERSIONS_TABLE,
                    {"name": sql.Identifier(self.schema, _APPROVALS_TABLE).as_string(conn)},
                )
                row = await cursor.fetchone()
                if row is None or not row[0]:
                    raise EffectStoreError(
                        f"schema {self.schema!r} has no agent-ledger tables of version 4: "
                        f"create or upgrade them first with {self._init_command()}",
                        operation="install_roles",
                    )
                await conn.execute(text)
                cursor = await conn.execute(
                    sql.SQL(q.ROLES_SAVE).format(settings=names["settings"]), params
                )
                saved = await cursor.fetchone()
        if saved is None:
            raise EffectStoreError(
                "the roles' settings row was not written", operation="install_roles"
            )
        return LedgerRoles(*saved)

    async def installed_roles(self) -> LedgerRoles | None:
        """The role set installed in this schema; None when ``install_roles`` never ran."""
        with self._errors("installed_roles"):
            async with self._pool.connection() as conn:
                name = sql.Identifier(self.schema, ROLES_TABLE).as_string(conn)
                cursor = await conn.execute(q.HAS_VERSIONS_TABLE, {"name": name})
                row = await cursor.fetchone()
                if row is None or not row[0]:
                    return None
                cursor = await conn.execute(
                    sql.SQL(q.ROLES_READ).format(settings=sql.Identifier(self.schema, ROLES_TABLE))
                )
                found = await cursor.fetchone()
        return None if found is None else LedgerRoles(*found)
