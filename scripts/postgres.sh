#!/usr/bin/env bash
# Makes sure a PostgreSQL server is up on 127.0.0.1:5432 for the tests (trust auth for the
# user postgres over loopback TCP) and that their database exists; fails if it cannot be
# reached. Installs PostgreSQL from the distribution's packages when it is missing (as root).
#
# usage: scripts/postgres.sh
# env:   MCP_TASKS_TEST_POSTGRES  server URL without a database (default
#        postgres://postgres@127.0.0.1:5432); a server elsewhere is only checked, not started.
set -euo pipefail

server=${MCP_TASKS_TEST_POSTGRES:-postgres://postgres@127.0.0.1:5432}
database=mcp_tasks_test

reachable() { psql "$server/postgres" -Atqc 'select 1' >/dev/null 2>&1; }

if ! reachable && [[ $server == postgres://postgres@127.0.0.1:5432 ]]; then
  if ! command -v pg_lsclusters >/dev/null; then
    echo "-- installing PostgreSQL (apt)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  version=$(ls /etc/postgresql | sort -n | tail -n 1)
  if [[ -z $version ]]; then
    echo "error: no PostgreSQL cluster found in /etc/postgresql" >&2
    exit 1
  fi
  hba=/etc/postgresql/$version/main/pg_hba.conf
  if ! grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
    # Tests connect as postgres over loopback without a password.
    sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
  fi
  echo "-- starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null ||
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload
  for _ in $(seq 1 60); do
    reachable && break
    sleep 0.5
  done
fi

if ! reachable; then
  echo "error: PostgreSQL is not reachable at $server" >&2
  exit 1
fi
if [[ -z $(psql "$server/postgres" -Atqc "select 1 from pg_database where datname = '$database'") ]]; then
  psql "$server/postgres" -qc "create database $database"
fi
echo "PostgreSQL is up at $server (database $database)"
