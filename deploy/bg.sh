#!/usr/bin/env bash
# Jobs that outlive one host call. The lent GPU host limits a command to 10 minutes but keeps a
# process that started its own session (setsid) running while the machine stays warm, so a long
# job is started in one call and waited on in the next ones (chain them: the host goes back when
# idle):
#
#   bash deploy/bg.sh start NAME -- CMD ARGS...   # returns at once
#   bash deploy/bg.sh wait NAME SECONDS           # until NAME ends or SECONDS pass
#   bash deploy/bg.sh status                      # every job: running / exit code
#
# Each job keeps $BG_DIR/NAME/{cmd,pid,log,rc} (BG_DIR default /tmp/bg). `wait` prints the log's
# new lines since the last wait and exits 0 if the job ended with 0, the job's code if it failed,
# and 3 if it is still running.
set -uo pipefail
BG_DIR="${BG_DIR:-/tmp/bg}"
usage() { sed -n '2,14p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
verb=$1; shift
case "$verb" in
  start)
    [ $# -ge 3 ] && [ "$2" = "--" ] || usage
    name=$1; shift 2
    dir="$BG_DIR/$name"
    if [ -f "$dir/pid" ] && [ ! -f "$dir/rc" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "bg: $name is already running (pid $(cat "$dir/pid"))" >&2; exit 1
    fi
    rm -rf "$dir" && mkdir -p "$dir"
    printf '%q ' "$@" > "$dir/cmd"
    echo 0 > "$dir/shown"
    # The rc file is written by the job's own shell, so `wait` can tell "ended" from "killed".
    setsid bash -c '"$@"; echo $? > "$0/rc"' "$dir" "$@" > "$dir/log" 2>&1 < /dev/null &
    echo $! > "$dir/pid"
    echo "bg: started $name (pid $!): $(cat "$dir/cmd")"
    ;;
  wait)
    [ $# -eq 2 ] || usage
    name=$1 limit=$2 dir="$BG_DIR/$1"
    [ -f "$dir/pid" ] || { echo "bg: no job $name in $BG_DIR (was the host replaced?)" >&2; exit 1; }
    t0=$SECONDS
    while [ ! -f "$dir/rc" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do
      kill -0 "$(cat "$dir/pid")" 2>/dev/null || break
      sleep 2
    done
    shown=$(cat "$dir/shown"); total=$(wc -l < "$dir/log")
    tail -n +"$((shown + 1))" "$dir/log" | head -n "$((total - shown))"
    echo "$total" > "$dir/shown"
    if [ -f "$dir/rc" ]; then
      rc=$(cat "$dir/rc"); echo "bg: $name ended with exit code $rc after waiting $((SECONDS - t0)) s"; exit "$rc"
    elif kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      echo "bg: $name still running after waiting $((SECONDS - t0)) s"; exit 3
    else
      echo "bg: $name is gone without an exit code (killed)"; exit 1
    fi
    ;;
  status)
    for dir in "$BG_DIR"/*/; do
      [ -f "$dir/pid" ] || continue
      name=$(basename "$dir")
      if [ -f "$dir/rc" ]; then state="exit $(cat "$dir/rc")"
      elif kill -0 "$(cat "$dir/pid")" 2>/dev/null; then state=running
      else state=killed; fi
      echo "$name: $state: $(cat "$dir/cmd")"
    done
    ;;
  *) usage ;;
esac
