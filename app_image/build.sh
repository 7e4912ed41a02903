#!/usr/bin/env bash
# Build the DataDesk app image offline from a plain checkout (no install needed,
# only python3 with the `docker` package):
#   app_image/build.sh [--force] [--base IMAGE] [--print-tag]
# See app_image/build.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/build.py" "$@"
