"""Opens the store a `--store` URL names."""

from __future__ import annotations

from roundtable.store.base import RunStore
from roundtable.store.sqlite import SqliteRunStore, sqlite_path


async def open_store(url: str) -> RunStore:
    """`sqlite:///path/to/file.db` (the embedded default) or `postgresql://...` (replicas)."""
    if url.startswith(("postgresql://", "postgres://")):
        # Imported here so a SQLite-only deployment never loads the Postgres driver.
        from roundtable.store.postgres import PostgresRunStore

        return await PostgresRunStore.open(url)
    return await SqliteRunStore.open(sqlite_path(url))
