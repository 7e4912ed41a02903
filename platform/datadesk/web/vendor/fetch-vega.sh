#!/usr/bin/env bash
# Reproduce web/vendor/vega/: the minified builds of the chart renderer, with their licenses,
# from the npm registry (pinned versions; the app serves them under /static, never a CDN).
# vega, vega-lite and vega-embed are their UMD builds (web/js/charts.js loads them as
# scripts when a chart is first shown, in this order: they set globalThis.vega, vegaLite and
# vegaEmbed); vega-interpreter ships only an ES module that imports from 'vega-util', which
# vega re-exports, so its one import line is rewritten to read globalThis.vega.
#   platform/datadesk/web/vendor/fetch-vega.sh
# Needs npm and network access on the machine that runs it; the files are committed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$here/vega"
VEGA=6.4.0
VEGA_LITE=6.5.0
VEGA_EMBED=7.3.0
VEGA_INTERPRETER=2.3.2
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
for spec in "vega@$VEGA" "vega-lite@$VEGA_LITE" "vega-embed@$VEGA_EMBED" "vega-interpreter@$VEGA_INTERPRETER"; do
  npm pack --silent "$spec" >/dev/null
done
mkdir -p "$out"
rm -f "$out"/*
take() {  # take NAME VERSION FILE-IN-PACKAGE OUT-NAME
  mkdir -p "pkg-$1"
  tar -xzf "$1-$2.tgz" -C "pkg-$1"
  cp "pkg-$1/package/$3" "$out/$4"
  cp "pkg-$1/package/LICENSE" "$out/LICENSE-$1"
}
take vega "$VEGA" build/vega.min.js vega.min.js
take vega-lite "$VEGA_LITE" build/vega-lite.min.js vega-lite.min.js
take vega-embed "$VEGA_EMBED" build/vega-embed.min.js vega-embed.min.js
take vega-interpreter "$VEGA_INTERPRETER" build/vega-interpreter.js vega-interpreter.module.js
import="import { ascending, isString, DisallowedObjectProperties } from 'vega-util';"
grep -qxF "$import" "$out/vega-interpreter.module.js" || { echo "vega-interpreter: its import line changed" >&2; exit 1; }
sed -i "s|^$import\$|const { ascending, isString, DisallowedObjectProperties } = globalThis.vega;|" \
  "$out/vega-interpreter.module.js"
printf 'vega %s\nvega-lite %s\nvega-embed %s\nvega-interpreter %s\n' \
  "$VEGA" "$VEGA_LITE" "$VEGA_EMBED" "$VEGA_INTERPRETER" > "$out/VERSIONS"
ls -l "$out"
