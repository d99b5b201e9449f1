#!/usr/bin/env bash
# A soak of the replica crash suite: RUNS runs (default 100) of its two fenced tests, each on a
# fresh random MCP_TASKS_BASE_SEED, against copies of the test executable and of the binary (so
# the crate can be rebuilt meanwhile). Prints one line per run and, at the end, the failure
# rate; the full output of every failing run is kept in OUT (default a temporary directory).
#
#   scripts/soak-replicas.sh [RUNS] [OUT]
#
# With SOAK_BIN=PATH the replicas run that mcp-tasks binary instead of this tree's (for a
# failure rate of an older commit under this tree's suite and checker: build the older commit
# in a worktree of its own and pass its target/debug/mcp-tasks).
#
# Needs PostgreSQL (scripts/postgres.sh) and the root of the repository as working directory.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
out=${2:-$(mktemp -d -t mcp-tasks-soak.XXXXXX)}
mkdir -p "$out"
target=${CARGO_TARGET_DIR:-target}

echo "== building the replica crash suite"
exe=$(cargo test -p mcp-tasks-cli --test pg --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "pg":
        print(m["executable"])')
cp "$exe" "$out/pg"
if [[ -n "${SOAK_BIN:-}" ]]; then
  cp "$SOAK_BIN" "$out/mcp-tasks"
  binary="$SOAK_BIN"
else
  cargo build --bin mcp-tasks
  cp "$target/debug/mcp-tasks" "$out/mcp-tasks"
  binary="this tree's"
fi
echo "== $runs runs; failures kept in $out (suite of commit $(git rev-parse --short HEAD), binary: $binary)"

failed=0
started=$(date +%s)
for ((i = 1; i <= runs; i++)); do
  seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
  log="$out/run-$i.log"
  t0=$(date +%s)
  if MCP_TASKS_REQUIRE_POSTGRES=1 MCP_TASKS_BIN="$out/mcp-tasks" MCP_TASKS_BASE_SEED=$seed \
    "$out/pg" --exact crash_replicas::replicas_killed_and_paused_past_their_lease_keep_every_invariant \
    crash_replicas::replicas_and_postgres_restarts_keep_every_invariant >"$log" 2>&1; then
    echo "run $i: ok ($(($(date +%s) - t0)) s, base seed $seed)"
    rm -f "$log"
  else
    failed=$((failed + 1))
    echo "run $i: FAILED ($(($(date +%s) - t0)) s, base seed $seed): $log"
    grep -E "^\s+\[|violation" "$log" | head -5 || true
  fi
done
echo "== $failed of $runs runs failed, in $(($(date +%s) - started)) s"
(( failed == 0 ))
