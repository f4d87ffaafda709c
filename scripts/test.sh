#!/usr/bin/env bash
# Install the project with its test extra (CPU torch first) and run the tests.
# This is the README's test command and what .ci/run runs. Arguments go to pytest.
#
# The SARIF test validates against the official SARIF 2.1.0 JSON schema, which is not ours
# to copy into the repository: it is fetched here, at install time, from the npm package
# @microsoft/jest-sarif (package/lib/schemas/sarif-2.1.0-rtm.5.json), checked against a pinned
# sha256 and cached in .cache/sarif/ (git-ignored). Tests never touch the network.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
. .venv/bin/activate
pip install torch==2.13.0
pip install -e ".[test]"

SARIF_PKG="@microsoft/jest-sarif@1.0.0-beta.0"
SARIF_MEMBER="package/lib/schemas/sarif-2.1.0-rtm.5.json"
SARIF_SHA256="2d99159ae54a3eea97f81781cff48780548657c35949f4b7f25e99a2ba4de4f8"
SARIF_SCHEMA=".cache/sarif/sarif-2.1.0-rtm.5.json"
if [ ! -s "$SARIF_SCHEMA" ]; then
    mkdir -p .cache/sarif
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    (cd "$tmp" && npm pack --silent "$SARIF_PKG" > tarball-name)
    tar -xzf "$tmp/$(cat "$tmp/tarball-name")" -C "$tmp" "$SARIF_MEMBER"
    echo "$SARIF_SHA256  $tmp/$SARIF_MEMBER" | sha256sum --check --quiet
    mv "$tmp/$SARIF_MEMBER" "$SARIF_SCHEMA"
fi

# One BLAS/OpenMP thread unless the caller says otherwise: the models under test are tiny, and on
# a 2-core runner torch's and BLAS's thread pools only fight numba's (results do not depend on it).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" \
       MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
python -m pytest "$@"
