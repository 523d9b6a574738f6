#!/usr/bin/env bash
# `make test`'s stages: runs one (`tools/stage.sh <name> <command...>`), prints how long it took, and
# keeps the figure in .run/stages so the last stage can print them all (`tools/stage.sh --summary`).
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=.run/stages
if [ "${1:-}" = "--summary" ]; then
  [ -f "$LOG" ] && { echo "[make test] stage durations:"; sed 's/^/  /' "$LOG"; rm -f "$LOG"; }
  exit 0
fi
if [ "${1:-}" = "--reset" ]; then rm -f "$LOG"; exit 0; fi
name=$1; shift
mkdir -p .run
start=$(date +%s)
"$@"
status=$?
seconds=$(( $(date +%s) - start ))
result=$([ $status -eq 0 ] && echo ok || echo "FAILED ($status)")
printf '%-13s %4d s  %s\n' "$name" "$seconds" "$result" >> "$LOG"
echo "[make test] $name: ${seconds}s, $result"
if [ $status -ne 0 ]; then tools/stage.sh --summary; fi
exit $status
