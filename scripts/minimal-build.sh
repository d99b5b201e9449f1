#!/usr/bin/env bash
# The library as an embedder with the smallest build takes it (`default-features = false,
# features = ["redb"]`): it must build, carry no HTTP server, TLS client, JWT or TOML, and
# stay within its dependency budget. Prints the crate counts of the minimal and the full
# build (crates/mcp-tasks/README.md states them). Seconds, once the dependencies are compiled.
set -euo pipefail
cd "$(dirname "$0")/.."

budget=${MINIMAL_CRATE_BUDGET:-150}
# Distinct crates (name and version) in the normal-dependency tree, the library included.
count() { cargo tree -p mcp-tasks -e normal --prefix none "$@" | sed 's/ (\*)$//; s/ (proc-macro)$//' | awk '{print $1" "$2}' | sort -u | wc -l; }

minimal=(--no-default-features --features redb)
echo "-- cargo check -p mcp-tasks ${minimal[*]}"
cargo check --quiet -p mcp-tasks "${minimal[@]}"
n_min=$(count "${minimal[@]}")
n_default=$(count)
n_full=$(count --all-features)
echo "crates in the library's tree: minimal (redb) $n_min, default $n_default, every feature $n_full"

forbidden=$(cargo tree -p mcp-tasks -e normal --prefix none "${minimal[@]}" |
  awk '{print $1}' | grep -xE 'axum|hyper|hyper-util|reqwest|rustls|jsonwebtoken|toml' | sort -u || true)
if [[ -n "$forbidden" ]]; then
  echo "the minimal build pulls in what only the http/jwt/client features should: $(echo $forbidden)" >&2
  exit 1
fi
if (( n_min > budget )); then
  echo "the minimal build has $n_min crates, over its budget of $budget" >&2
  exit 1
fi
echo "ok: no HTTP server, TLS client, JWT or TOML in the minimal build, $n_min <= $budget crates"
