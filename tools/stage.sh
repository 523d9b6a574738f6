#!/usr/bin/env bash
# `make test`'s stages: runs one (`tools/stage.sh <name> <command...>`), prints how long it took, and
# keeps the figure in .run/stages so the last stage can print them all (`tools/stage.sh --summary`).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=.run/stages
if [ "${1:-}" = "--summary" ]; then
  if [ -f "$LOG" ]; then
    echo "[make test] stage durations (the integration stages and unit run beside cluster-test, inside its time):"
    sed 's/^/  /' "$LOG"
    began=$(cat "$LOG.start" 2>/dev/null || echo "")
    [ -z "$began" ] || printf '  %-13s %4d s\n' total $(( $(date +%s) - began ))
    rm -f "$LOG" "$LOG.start"
  fi
  exit 0
fi
if [ "${1:-}" = "--reset" ]; then rm -f "$LOG"; mkdir -p .run; date +%s > "$LOG.start"; exit 0; fi
name=$1; shift
mkdir -p .run
start=$(date +%s)
"$@"
status=$?
seconds=$(( $(date +%s) - start ))
result=$([ $status -eq 0 ] && echo ok || echo "FAILED ($status)")
printf '%-13s %4d s  %s\n' "$name" "$seconds" "$result" >> "$LOG"
echo "[make test] $name: ${seconds}s, $result"
# a stage run beside another (STAGE_QUIET_FAILURE) leaves the summary to the stage that waits for it
if [ $status -ne 0 ] && [ -z "${STAGE_QUIET_FAILURE:-}" ]; then tools/stage.sh --summary; fi
exit $status
