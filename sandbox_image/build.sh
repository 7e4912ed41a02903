#!/usr/bin/env bash
# Build the DataDesk kernel image from a plain checkout (no install needed).
#   sandbox_image/build.sh [--force] [--base IMAGE] [--print-tag]
# See platform/datadesk/sandbox/backends/docker/image.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$here/../platform${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m datadesk.sandbox.backends.docker.image --context "$here" "$@"
