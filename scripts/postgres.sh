#!/usr/bin/env bash
# Starts a throwaway PostgreSQL for the tests (Debian's packages; installs them if missing)
# and prints the DSN. Idempotent: a second call finds the server running and prints it again.
#   eval "$(scripts/postgres.sh env)"   exports ROUNDTABLE_TEST_POSTGRES_DSN
#   scripts/postgres.sh stop
set -euo pipefail
port=${ROUNDTABLE_PG_PORT:-55432}
data=${ROUNDTABLE_PG_DATA:-/tmp/roundtable-pg-$port}
dsn="postgresql://postgres@127.0.0.1:$port/roundtable"

pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$dir" ] && echo "$dir"
}

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-start}" in
  stop)
    bin=$(pg_bin) && as_postgres "$bin/pg_ctl" -D "$data" stop -m fast >/dev/null 2>&1 || true
    exit 0 ;;
esac

bin=$(pg_bin || true)
if [ -z "$bin" ]; then
  echo "installing PostgreSQL from Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
  bin=$(pg_bin)
fi

if ! as_postgres "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" 2>/dev/null; then
  if [ ! -s "$data/PG_VERSION" ]; then
    mkdir -p "$data"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$data"
    as_postgres "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 >/dev/null
  fi
  as_postgres "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w \
    -o "-p $port -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c max_connections=200" \
    start >/dev/null
fi
as_postgres "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -tAc \
  "SELECT 1 FROM pg_database WHERE datname='roundtable'" | grep -q 1 ||
  as_postgres "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres roundtable

if [ "${1:-start}" = env ]; then
  echo "export ROUNDTABLE_TEST_POSTGRES_DSN=$dsn"
else
  echo "$dsn"
fi
