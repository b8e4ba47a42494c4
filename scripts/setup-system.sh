#!/usr/bin/env bash
# System packages Tempered needs: bubblewrap (local sandbox), runsc (gVisor), util-linux (setpriv;
# setsid, for the lint `make test` runs beside the tests),
# chromium (headless, for the test that reads the Temporal UI through the codec server),
# python3.11-venv where Debian's python3.11 lacks it.
# Installs only what is missing; needs root (or sudo) the first time.
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v runsc >/dev/null || missing+=(runsc)
command -v setpriv >/dev/null || missing+=(util-linux)  # setsid comes with it
command -v chromium >/dev/null || missing+=(chromium)
# Debian's python3.11 makes no venv without its venv package (ensurepip)
if command -v python3.11 >/dev/null && ! python3.11 -c "import ensurepip" 2>/dev/null; then
  missing+=(python3.11-venv)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing system packages: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
