"""A schema of its own with the role set installed, and real login roles.

Each test gets a fresh schema and a random role prefix (roles are shared by
the whole server), login roles granted the group roles, and stores that
connect as each login. Everything is dropped afterwards, roles included.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from agent_ledger.stores._postgres_roles import LedgerRoles
from agent_ledger.stores.postgres import PostgresStore
from tests.harness import DSN, require_postgres


@dataclass
class RoleWorld:
    schema: str
    roles: LedgerRoles
    #: The superuser's store (as the tests' other PostgreSQL fixtures connect).
    admin: PostgresStore
    partitioned: bool
    #: Login role name by what it is for: worker, approver, both, owner, nobody.
    logins: dict[str, str]
    _stores: list[PostgresStore] = field(default_factory=list)

    def dsn(self, who: str) -> str:
        return make_conninfo(DSN, user=self.logins[who], password="pw-" + self.logins[who])

    async def store(self, who: str) -> PostgresStore:
        """A store connected as the login role ``who`` (closed with the world)."""
        store = await PostgresStore.connect(
            self.dsn(who),
            schema=self.schema,
            min_size=1,
            max_size=4,
            partitioned=True if self.partitioned else None,
        )
        self._stores.append(store)
        return store

    async def sql(self, query: sql.Composable | str, *params: object) -> list[tuple[object, ...]]:
        """Run ``query`` as the superuser, outside any store."""
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            cursor = await conn.execute(query, params or None)  # type: ignore[arg-type]
            return await cursor.fetchall() if cursor.description else []


@asynccontextmanager
async def role_world(
    *, partitioned: bool = False, separate_duty: bool = False
) -> AsyncIterator[RoleWorld]:
    require_postgres()
    suffix = uuid.uuid4().hex[:8]
    schema = f"agent_ledger_roles_{suffix}"
    prefix = f"al_{suffix}_"
    admin = await PostgresStore.connect(
        DSN, schema=schema, min_size=1, max_size=2, partitioned=True if partitioned else None
    )
    logins = {
        "worker": prefix + "w",
        "approver": prefix + "a",
        "both": prefix + "wa",
        "owner": prefix + "o",
        "nobody": prefix + "n",
    }
    created: list[str] = []
    world: RoleWorld | None = None
    try:
        await admin.create_schema()
        roles = await admin.install_roles(prefix=prefix, separate_duty=separate_duty)
        created += [roles.owner, roles.worker, roles.approver]
        grants = {
            "worker": [roles.worker],
            "approver": [roles.approver],
            "both": [roles.worker, roles.approver],
            "owner": [roles.owner],
            "nobody": [],
        }
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            for who, login in logins.items():
                await conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(login), sql.Literal("pw-" + login)
                    )
                )
                created.insert(0, login)
                for group in grants[who]:
                    await conn.execute(
                        sql.SQL("GRANT {} TO {}").format(
                            sql.Identifier(group), sql.Identifier(login)
                        )
                    )
        world = RoleWorld(schema, roles, admin, partitioned, logins)
        yield world
    finally:
        if world is not None:
            for store in world._stores:
                await store.close()
        await admin.close()
        async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
            await conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
            for role in created:
                await conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                await conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
