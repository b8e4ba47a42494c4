#!/usr/bin/env bash
# System packages Tempered needs, with apt. Installs only what is missing; needs root (or sudo)
# the first time.
#   needed (a failure stops setup): bubblewrap (the local sandbox), util-linux (setpriv; setsid,
#     for the lint `make test` runs beside the tests), python3.11-venv where Debian's python3.11
#     lacks it.
#   optional (each tried on its own; a failure is a warning, and setup goes on): runsc (gVisor's
#     sandbox backend) and chromium (headless, for the test that reads the Temporal UI through
#     the codec server). `make train` needs neither, and not every archive has them: runsc comes
#     from gVisor's own apt repository, and Ubuntu's chromium is a snap stub.
set -euo pipefail
needed=()
command -v bwrap >/dev/null || needed+=(bubblewrap)
command -v setpriv >/dev/null || needed+=(util-linux)  # setsid comes with it
# Debian's python3.11 makes no venv without its venv package (ensurepip)
if command -v python3.11 >/dev/null && ! python3.11 -c "import ensurepip" 2>/dev/null; then
  needed+=(python3.11-venv)
fi
optional=()
command -v runsc >/dev/null || optional+=(runsc)
command -v chromium >/dev/null || optional+=(chromium)
declare -A without=(
  [runsc]="runsc (gVisor) not installed: the gvisor sandbox backend cannot run, and its tests \
skip (tests/infra/sandbox/test_gvisor.py, the gvisor cases of tests/infra/sandbox/); gVisor's \
apt repository: https://gvisor.dev/docs/user_guide/install/"
  [chromium]="chromium not installed: the Temporal UI test skips (tests/test_ui.py); a chromium \
that does not start (Ubuntu's snap stub without snapd) makes it fail instead"
)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt() { DEBIAN_FRONTEND=noninteractive $sudo apt-get "$@"; }
updated=false
if [ ${#needed[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${needed[*]}"
  apt update -qq
  updated=true
  apt install -y -qq "${needed[@]}" >/dev/null
fi
for package in "${optional[@]}"; do
  echo "setup: installing optional system package: ${package}"
  if { $updated || apt update -qq; } && apt install -y -qq "${package}" >/dev/null; then
    updated=true
  else
    echo "setup: warning: ${without[${package}]}; make train does not need it" >&2
  fi
done
if command -v chromium >/dev/null && ! timeout 60 chromium --version >/dev/null 2>&1; then
  echo "setup: warning: $(command -v chromium) does not start (Ubuntu's snap stub?): \
tests/test_ui.py will fail; put a chromium that runs first on PATH" >&2
fi
