#!/usr/bin/env bash
# scripts/not-run.sh LOG: the tests that did not run, from LOG, the file named by $TQ_SKIP_LOG
# to which fixtures::not_run / fixtures::no_device append one "CRATE::TEST: reason" line each.
# One line per test (its reasons joined), then a last line "N tests not run". A GPU-device test
# with no device visible ("not run: no device") is listed, named on the last line, and not counted
# as run or as a failure; any other test that did not run is counted, and makes this exit 1.
set -euo pipefail
log="${1:?usage: scripts/not-run.sh LOG}"
[ -f "$log" ] || : > "$log"
awk '
  {
    i = index($0, ": "); if (i == 0) { key = $0; why = "?" } else { key = substr($0, 1, i - 1); why = substr($0, i + 2) }
    if (!(key in reasons)) { order[++n] = key; reasons[key] = why; device[key] = 1 }
    else if (index("; " reasons[key] "; ", "; " why "; ") == 0) reasons[key] = reasons[key] "; " why
    if (why !~ /^not run: no device/) device[key] = 0
  }
  END {
    bad = 0; dev = ""
    for (k = 1; k <= n; k++) {
      key = order[k]
      if (device[key]) { printf "  %s: %s\n", key, reasons[key]; dev = dev (dev == "" ? "" : ", ") key }
      else { printf "  NOT RUN %s: %s\n", key, reasons[key]; bad++ }
    }
    line = bad " test" (bad == 1 ? "" : "s") " not run"
    if (dev != "") line = line " (not run: no device, not counted as passed: " dev ")"
    print line
    exit bad > 0 ? 1 : 0
  }' "$log"
