#!/usr/bin/env bash
# Installs what the console's browser tests need (crates/mcp-tasks-cli/tests/support/browser.rs
# drives it over the DevTools protocol): Debian's Chromium at a pinned version, and DejaVu for
# the text of its screenshots (fonts-dejavu-core). Skips the install when /usr/bin/chromium is
# there and runs (`chromium --version`) and the font is installed: then it takes a fraction of
# a second.
# Debian's security archive keeps only the newest Chromium build, so when the pinned one is no
# longer offered this installs the archive's candidate instead, with a warning (then move the
# pin below to it).
#
# usage: scripts/browser.sh
# env:   MCP_TASKS_CHROMIUM  a Chromium of your own, which the tests then use: it is only
#                            checked (that it runs), nothing is installed
# Installing needs apt-get and root (or sudo). Prints Chromium's version; exits non-zero, with
# one line saying why, when it can neither find nor install a Chromium that runs.
set -euo pipefail

chromium_version=156.0.8078.114-1~deb12u1

fail() { echo "error: $*" >&2; exit 1; }
# Debian's launcher script prints a harmless shell warning on some machines: stderr is dropped.
version_of() { "$1" --version 2>/dev/null; }

if [[ -n ${MCP_TASKS_CHROMIUM:-} ]]; then
  version=$(version_of "$MCP_TASKS_CHROMIUM") \
    || fail "MCP_TASKS_CHROMIUM=$MCP_TASKS_CHROMIUM does not run (\`$MCP_TASKS_CHROMIUM --version\` failed)"
  echo "$version ($MCP_TASKS_CHROMIUM, from MCP_TASKS_CHROMIUM)"
  exit 0
fi

chromium=/usr/bin/chromium
font_installed() {
  [[ $(dpkg-query -W -f '${Status}' fonts-dejavu-core 2>/dev/null) == "install ok installed" ]]
}
if [[ -x $chromium ]] && version=$(version_of "$chromium") && font_installed; then
  echo "$version ($chromium)"
  exit 0
fi

command -v apt-get >/dev/null \
  || fail "no Chromium at $chromium and no apt-get to install one: install Chromium and set MCP_TASKS_CHROMIUM to it"
as_root=()
if (( EUID != 0 )); then
  command -v sudo >/dev/null || fail "installing Chromium needs root, and there is no sudo: run scripts/browser.sh as root"
  as_root=(sudo)
fi
apt_get() { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 "$@"; }

echo "-- installing Chromium (apt)"
apt_get update -qq || fail "apt-get update failed (see above)"
offered=$(apt-cache madison chromium | awk -F'|' '{ gsub(/ /, "", $2); print $2 }')
want=$chromium_version
if ! grep -qxF "$chromium_version" <<<"$offered"; then
  want=$(apt-cache policy chromium | awk '$1 == "Candidate:" { print $2 }')
  [[ -n $want && $want != "(none)" ]] \
    || fail "the package archive offers no chromium package (are Debian's sources, with bookworm-security, configured?)"
  {
    echo "WARNING: ************************************************************************"
    echo "WARNING: chromium $chromium_version (the pin in scripts/browser.sh) is no longer offered:"
    echo "WARNING: installing the archive's candidate, $want, instead. Move the pin to it."
    echo "WARNING: ************************************************************************"
  } >&2
fi
# chromium depends on chromium-common of exactly its own version: both are pinned.
apt_get install -y -qq --no-install-recommends \
  "chromium=$want" "chromium-common=$want" fonts-dejavu-core >/dev/null \
  || fail "apt-get install chromium=$want failed (see above)"

version=$(version_of "$chromium") || fail "Chromium $want is installed but \`$chromium --version\` fails"
echo "$version ($chromium, package $want)"
