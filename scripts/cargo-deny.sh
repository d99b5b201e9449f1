#!/usr/bin/env bash
# Installs cargo-deny at a pinned version from crates.io (skipped when that version is already
# on PATH), then checks the workspace's dependency graph against deny.toml: licenses, bans
# (duplicate or forbidden crates) and sources (crates.io only). Advisories are not checked here:
# they need the RustSec advisory database from GitHub.
#
# usage: scripts/cargo-deny.sh
# env:   CARGO_DENY_ROOT  where cargo-deny is installed (default: $HOME/.cargo; its bin/ is put
#                         on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.20.2
root=${CARGO_DENY_ROOT:-$HOME/.cargo}
export PATH=$root/bin:$PATH

if [[ "$(cargo-deny --version 2>/dev/null)" != "cargo-deny $version" ]]; then
  echo "== cargo install --locked cargo-deny@$version (into $root)"
  # Its own target folder, removed afterwards: the project's target/ keeps only the project.
  build=$(mktemp -d)
  CARGO_TARGET_DIR=$build cargo install --locked --root "$root" "cargo-deny@$version"
  rm -rf "$build"
fi
cargo-deny --version
cargo deny --locked check --hide-inclusion-graph licenses bans sources
