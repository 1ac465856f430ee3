# Sourced by tools/venv.sh. `with_heartbeat SECONDS FOLDER LABEL -- COMMAND...` runs COMMAND and,
# while it runs, prints one line every SECONDS: LABEL, the time since it started and FOLDER's size
# (FOLDER `-`: no size). pip -q installs GBs in silence for minutes; without -q its output would
# bury the rest of the setup's lines.
# Returns COMMAND's exit status.
with_heartbeat() {
  local every="$1" folder="$2" label="$3"; shift 4
  local start=$SECONDS rc=0 beat
  (
    # `wait` (unlike a foreground sleep) returns at once when the kill below arrives
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
      sleep "$every" & nap=$!
      wait "$nap"
      if [ "$folder" = - ]; then
        echo "[setup] $label: $((SECONDS - start)) s so far"
      else
        echo "[setup] $label: $((SECONDS - start)) s so far, $folder $(du -sm "$folder" 2>/dev/null | cut -f1) MB"
      fi
    done
  ) &
  beat=$!
  "$@" || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}
