#!/usr/bin/env bash
# Run several GPU jobs side by side in one device call, each on the GPUs it names, each under its
# own time limit, then pack every job's log and result files into ONE archive. Why: a device call
# returns at most 8 files and device time is counted per call, so on a 2-GPU host two independent
# suites should share one call and come back as one file.
#
#   bash deploy/on_gpus.sh --limit 540 --archive $OUT/results.tgz -- \
#       "0:python3 -m pytest -m gpu test/gpu/test_serving_tiny.py" \
#       "1:python3 -m pytest test/gpu/test_layerwise_correctness.py -k qwen3_moe-bf16"
#
# Job spec "GPUS:COMMAND": GPUS is a CUDA_VISIBLE_DEVICES value ("0", "1", "0,1"). Each job runs
# in the repository root with OUT set to its own folder (job-N/) and its output in job-N.log; the
# archive also holds summary.txt (rc and wall time per job). A job still running at --limit gets
# SIGTERM (SIGKILL 15 s later), so the archive is written even when a job hangs.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIMIT=540
ARCHIVE=""
die() { echo "on_gpus.sh: error: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --limit) LIMIT="${2:?}"; shift 2 ;;
    --archive) ARCHIVE="${2:?}"; shift 2 ;;
    --) shift; break ;;
    *) die "unknown option $1 (usage: on_gpus.sh [--limit S] --archive FILE.tgz -- 'GPUS:CMD' ...)" ;;
  esac
done
[ -n "$ARCHIVE" ] || die "--archive FILE.tgz is required"
[ $# -ge 1 ] || die "no jobs given (each job is 'GPUS:COMMAND')"
[[ "$LIMIT" =~ ^[0-9]+$ ]] || die "--limit must be whole seconds, got '$LIMIT'"

WORK="$(mktemp -d /tmp/on_gpus.XXXXXX)"
declare -a PIDS=() SPECS=() STARTS=()
i=0
for spec in "$@"; do
  gpus="${spec%%:*}"
  cmd="${spec#*:}"
  [[ "$gpus" =~ ^[0-9]+(,[0-9]+)*$ ]] && [ "$cmd" != "$spec" ] \
    || die "job '$spec': expected GPUS:COMMAND with GPUS like 0 or 0,1"
  mkdir -p "$WORK/job-$i"
  echo "on_gpus.sh: job-$i on GPU $gpus (limit ${LIMIT}s): $cmd"
  (cd "$REPO" && OUT="$WORK/job-$i" CUDA_VISIBLE_DEVICES="$gpus" PYTHONUNBUFFERED=1 \
      exec timeout --kill-after 15 "$LIMIT" bash -c "$cmd") >"$WORK/job-$i.log" 2>&1 &
  PIDS+=($!)
  SPECS+=("$spec")
  STARTS+=($SECONDS)
  i=$((i + 1))
done

# Progress while waiting: every minute, each running job's last log line.
last=$SECONDS
while :; do
  running=0
  for j in "${!PIDS[@]}"; do kill -0 "${PIDS[$j]}" 2>/dev/null && running=$((running + 1)); done
  [ $running -eq 0 ] && break
  sleep 5
  [ $((SECONDS - last)) -lt 60 ] && continue
  last=$SECONDS
  for j in "${!PIDS[@]}"; do
    if kill -0 "${PIDS[$j]}" 2>/dev/null; then
      echo "on_gpus.sh: job-$j running $((SECONDS - STARTS[j]))s: $(tail -n 1 "$WORK/job-$j.log" | cut -c1-160)"
    fi
  done
done

for j in "${!PIDS[@]}"; do
  wait "${PIDS[$j]}"
  rc=$?
  note=""
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note=" (stopped at the ${LIMIT}s limit)"; fi
  echo "job-$j rc=$rc$note: ${SPECS[$j]}" >>"$WORK/summary.txt"
done
cat "$WORK/summary.txt"

mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$WORK" -czf "$ARCHIVE" . && echo "on_gpus.sh: wrote $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
for j in "${!PIDS[@]}"; do
  echo "===== job-$j log tail ====="
  tail -n 25 "$WORK/job-$j.log"
done
! grep -qv ' rc=0' "$WORK/summary.txt"
