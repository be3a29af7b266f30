"""Opens the store a `--store` URL names."""

from __future__ import annotations

from roundtable.domain.errors import InvalidSettings
from roundtable.domain.snapshot import server_of
from roundtable.store.base import RunStore, StoreUnavailable
from roundtable.store.sqlite import SqliteRunStore, sqlite_path


async def open_store(url: str) -> RunStore:
    """`sqlite:///path/to/file.db` (the embedded default) or `postgresql://...` (replicas).

    Raises:
        InvalidSettings: the URL names no store, or the store cannot be opened (a folder,
            a file that is no SQLite database, a Postgres server not reached): a mistake
            the operator fixes, said in one line that names the store without its password.
    """
    try:
        if url.startswith(("postgresql://", "postgres://")):
            # Imported here so a SQLite-only deployment never loads the Postgres driver.
            from roundtable.store.postgres import PostgresRunStore

            return await PostgresRunStore.open(url)
        return await SqliteRunStore.open(sqlite_path(url))
    except StoreUnavailable as exc:
        raise InvalidSettings(f"--store {server_of(url)}: {exc}") from None
