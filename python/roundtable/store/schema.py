"""The run registry's and event log's tables, defined once for every store.

A store names its `Dialect`: the column types its database spells, how a statement names
a parameter, and the few clauses only it has. The tables, their columns and indexes, and
how a database made by an earlier version gets the columns added since, are the same for
SQLite and Postgres; `roundtable.store.statements` writes the statements on them once.

A column dropped from the schema stays in a database an earlier version made (with its
default, so inserts that leave it out still work): a replica of that version may still be
writing it during a rolling upgrade.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum


class ColumnType(StrEnum):
    """A column's kind of value; each dialect spells it in its own words."""

    TEXT = "text"
    INTEGER = "integer"
    """A 64-bit integer."""
    REAL = "real"
    """A double (seconds since the epoch, say)."""
    BLOB = "blob"


@dataclass(frozen=True, slots=True)
class Column:
    """One column: NOT NULL always; with a default when a row may be written without it."""

    name: str
    type: ColumnType
    default: str | None = None
    """The default as an SQL literal ("''", "0"); None: every insert must give a value.
    A column added after the first version needs one (old rows get it)."""


@dataclass(frozen=True, slots=True)
class Table:
    """A table and its primary key."""

    name: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    clustered: bool = False
    """Rows are stored in primary-key order, where the dialect can (SQLite: WITHOUT ROWID):
    for a table only ever read by its key."""

    @property
    def column_names(self) -> tuple[str, ...]:
        """The columns' names, in order."""
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True, slots=True)
class Index:
    """A secondary index."""

    name: str
    table: str
    columns: tuple[str, ...]
    where: str = ""
    """A partial index's condition, a literal a query repeats to use it ("": every row)."""


_PARAMETER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
"""A named parameter as the statements write it: `:tenant`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Dialect:
    """What one database spells differently; everything else is written once."""

    name: str
    types: Mapping[ColumnType, str]
    """Each column type in this database's words."""
    parameter: str
    """A named parameter, with `{}` for its name: ":{}" (sqlite3), "%({})s" (psycopg)."""
    clustered: str = ""
    """Appended to a clustered table's CREATE TABLE ("" where rows have no other order)."""
    add_column: str = "ALTER TABLE {table} ADD COLUMN {column}"
    """How a missing column is added to a table an earlier version made."""
    create_index: str = "CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns}){where}"
    """How an index is made where it is missing."""
    drop_index: str = "DROP INDEX IF EXISTS {name}"
    """How an index an earlier version made, and this one no longer uses, is dropped."""

    def bind(self, template: str) -> str:
        """A statement written with `:name` parameters, in this dialect's parameter style."""
        return _PARAMETER.sub(lambda m: self.parameter.format(m.group(1)), template)

    def column(self, column: Column) -> str:
        """A column's definition."""
        default = "" if column.default is None else f" DEFAULT {column.default}"
        return f"{column.name} {self.types[column.type]} NOT NULL{default}"


RUNS = Table(
    "rt_runs",
    columns=(
        Column("tenant", ColumnType.TEXT),
        Column("run_id", ColumnType.TEXT),
        Column("thread_id", ColumnType.TEXT),
        Column("fingerprint", ColumnType.TEXT),
        Column("status", ColumnType.TEXT),
        Column("last_seq", ColumnType.INTEGER, "0"),
        Column("trace_context", ColumnType.TEXT, "''"),
        Column("owner", ColumnType.TEXT, "''"),
        Column("lease_until", ColumnType.REAL, "0"),
        Column("cancel_mode", ColumnType.TEXT, "''"),
        Column("cancel_reason", ColumnType.TEXT, "''"),
        Column("continued_by", ColumnType.TEXT, "''"),
        Column("turn_hash", ColumnType.TEXT, "''"),
        Column("created_at", ColumnType.REAL),
        Column("updated_at", ColumnType.REAL),
    ),
    primary_key=("tenant", "run_id"),
)
"""The run registry: one row per run (the columns are `RunRecord`'s fields)."""

EVENTS = Table(
    "rt_events",
    columns=(
        Column("tenant", ColumnType.TEXT),
        Column("run_id", ColumnType.TEXT),
        Column("seq", ColumnType.INTEGER),
        Column("kind", ColumnType.TEXT),
        Column("body", ColumnType.BLOB),
    ),
    primary_key=("tenant", "run_id", "seq"),
    clustered=True,
)
"""The event log: each run's events in wire form, read back in `seq` order."""

TOOL_CALLS = Table(
    "rt_tool_calls",
    columns=(
        Column("tenant", ColumnType.TEXT),
        Column("run_id", ColumnType.TEXT),
        Column("call_key", ColumnType.TEXT),
        Column("reply_id", ColumnType.TEXT),
        Column("n", ColumnType.INTEGER),
        Column("turn", ColumnType.INTEGER),
        Column("tool", ColumnType.TEXT),
        Column("model_call_id", ColumnType.TEXT),
        Column("arguments_json", ColumnType.TEXT),
        Column("needs_approval", ColumnType.INTEGER),
        Column("status", ColumnType.TEXT),
        Column("verdict", ColumnType.TEXT, "''"),
        Column("reason", ColumnType.TEXT, "''"),
        Column("edited_arguments_json", ColumnType.TEXT, "''"),
        Column("expires_at", ColumnType.REAL, "0"),
        Column("decided_at", ColumnType.REAL, "0"),
        Column("result_text", ColumnType.TEXT, "''"),
        Column("outcome", ColumnType.TEXT, "''"),
        Column("attempts", ColumnType.INTEGER, "0"),
        Column("sent_key", ColumnType.TEXT, "''"),
        Column("turn_input_tokens", ColumnType.INTEGER, "0"),
        Column("turn_output_tokens", ColumnType.INTEGER, "0"),
        Column("turn_counted", ColumnType.INTEGER, "0"),
        Column("turn_model_calls", ColumnType.INTEGER, "0"),
        Column("created_at", ColumnType.REAL),
        Column("updated_at", ColumnType.REAL),
    ),
    primary_key=("tenant", "run_id", "call_key"),
    clustered=True,
)
"""Each tool call of a run: asked for, decided, sent and answered (`ToolCallRecord`)."""

TABLES = (RUNS, EVENTS, TOOL_CALLS)

LIVE_STATUS = "status IN ('running','queued','awaiting_approval')"
"""The runs a thread may be busy with: rt_runs_thread_live's condition, which a query
repeats word for word to use the index."""

INDEXES = (
    Index("rt_runs_thread", RUNS.name, ("tenant", "thread_id", "created_at")),
    # Every StartRun asks which runs of its thread are still going (`live_thread_runs`):
    # only those are in it, so a long thread costs that query nothing more.
    Index("rt_runs_thread_live", RUNS.name, ("tenant", "thread_id", "created_at"), LIVE_STATUS),
    Index("rt_runs_continued", RUNS.name, ("tenant", "continued_by")),
    # The parked-run watch (every 0.2 s per replica while anything waits) and the lease
    # renewal of parked runs look parked runs up by owner. Partial: only parked runs are
    # in it, so the status changes of every other run (queued, running, ended: three a
    # turn) write nothing to it.
    Index("rt_runs_awaiting", RUNS.name, ("owner",), where="status = 'awaiting_approval'"),
    Index("rt_tool_calls_expiry", TOOL_CALLS.name, ("verdict", "needs_approval", "expires_at")),
)

RETIRED_INDEXES = ("rt_runs_parked",)
"""Indexes an earlier version made that nothing reads any more, dropped at start after the
indexes above exist. rt_runs_parked held every run by (status, owner); rt_runs_awaiting
holds the parked ones only."""


def create_tables(dialect: Dialect) -> list[str]:
    """CREATE TABLE IF NOT EXISTS for every table (a table an earlier version made stays)."""
    out = []
    for table in TABLES:
        body = ", ".join(
            [
                *(dialect.column(c) for c in table.columns),
                f"PRIMARY KEY ({', '.join(table.primary_key)})",
            ]
        )
        suffix = dialect.clustered if table.clustered else ""
        out.append(f"CREATE TABLE IF NOT EXISTS {table.name} ({body}){suffix}")
    return out


def add_missing_columns(dialect: Dialect, table: Table, present: Iterable[str]) -> list[str]:
    """The statements that add the columns a table made by an earlier version lacks.

    `present` is what the database says the table has: looking first, rather than adding
    blindly, keeps a replica starting next to running ones from locking the table.
    """
    have = set(present)
    return [
        dialect.add_column.format(table=table.name, column=dialect.column(c))
        for c in table.columns
        if c.name not in have
    ]


def create_indexes(dialect: Dialect) -> list[str]:
    """The statements that make every missing index (after the columns they cover exist)."""
    return [
        dialect.create_index.format(
            name=i.name,
            table=i.table,
            columns=", ".join(i.columns),
            where=f" WHERE {i.where}" if i.where else "",
        )
        for i in INDEXES
    ]


def drop_retired_indexes(dialect: Dialect) -> list[str]:
    """The statements that drop `RETIRED_INDEXES` (nothing where they are gone already)."""
    return [dialect.drop_index.format(name=name) for name in RETIRED_INDEXES]
