#!/usr/bin/env bash
# Runs a real legacy client against `mcp-tasks serve --fixtures conformance`: the official MCP
# Python SDK at a release that predates 2026-07-28 (it speaks 2025-11-25, with the
# experimental tasks), installed from PyPI into a virtualenv, drives scripts/legacy_client.py:
# a session, a synchronous call, a task run to completion, a task that asks for input, the
# task list and a cancellation.
#
# usage: scripts/legacy-client.sh
# env:   LEGACY_CLIENT_DIR  the virtualenv (default: $HOME/.cache/mcp-tasks-legacy-client)
#        LEGACY_CLIENT_OUT  folder for the server log (default: target/legacy-client)
#        MCP_TASKS_PROFILE  the cargo profile the server is built with (default: release)
# Needs python3 with venv and pip. Exits non-zero if any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

sdk_version=1.26.0
venv=${LEGACY_CLIENT_DIR:-$HOME/.cache/mcp-tasks-legacy-client}
out=${LEGACY_CLIENT_OUT:-target/legacy-client}

echo "== build"
profile=${MCP_TASKS_PROFILE:-release}
cargo build --profile "$profile" --quiet --bin mcp-tasks
[[ $profile == dev ]] && profile_dir=debug || profile_dir=$profile
bin=$PWD/${CARGO_TARGET_DIR:-target}/$profile_dir/mcp-tasks

echo "== MCP Python SDK $sdk_version (in $venv)"
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '$sdk_version')" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$sdk_version" >&2
fi
py=$venv/bin/python
"$py" -c "import mcp.types as t; assert t.LATEST_PROTOCOL_VERSION == '2025-11-25', t.LATEST_PROTOCOL_VERSION"

rm -rf "$out"
mkdir -p "$out"
work=$(mktemp -d)
server_pid=
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
url="http://127.0.0.1:$port/mcp"
"$bin" serve --fixtures conformance --listen "127.0.0.1:$port" --store "$work/legacy.redb" \
  >"$out/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 150); do
  kill -0 "$server_pid" 2>/dev/null || { echo "error: the server exited; see $out/server.log" >&2; exit 1; }
  if "$py" -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.5)' "$port" 2>/dev/null; then
    break
  fi
  sleep 0.1
done

echo "== legacy client against $url"
timeout 300 "$py" scripts/legacy_client.py "$url"
