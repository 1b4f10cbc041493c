#!/usr/bin/env bash
# Runs a command inside an Xvfb server of its own: DISPLAY names a server that this script started
# and stops afterwards.
#
# Why not `xvfb-run -a`: it looks for a free display number by the lock files in /tmp and then
# starts the server; two runs that look at the same moment (CTest runs GUI tests in parallel) both
# take :99, one server loses, and its app finds no display ("Failed to open display :99"). Here
# each server is started on a number and the server's own lock decides (see start_server below);
# a run that loses tries the next number, so parallel runs never share one.
#
# Usage: tools/with-xvfb.sh [-s "SERVER ARGS"] COMMAND [ARGS...]
#        (SERVER ARGS default to "-screen 0 1600x1000x24", the size every GUI test expects)
set -uo pipefail
server_args="-screen 0 1600x1000x24"
if [[ "${1:-}" == "-s" ]]; then
  server_args=$2
  shift 2
fi
if (($# == 0)); then
  echo "usage: tools/with-xvfb.sh [-s \"SERVER ARGS\"] COMMAND [ARGS...]" >&2
  exit 2
fi
if ! command -v Xvfb >/dev/null; then
  echo "with-xvfb: Xvfb not found (Debian package xvfb; tools/bootstrap.sh installs it)" >&2
  exit 2
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/kvscope-xvfb.XXXXXX")
server=0
cleanup() {
  if ((server > 0)); then
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# The server writes its display number and a newline to the descriptor once it accepts clients.
# The number is ours to choose, and the server's own lock file (/tmp/.XN-lock, made with an
# atomic link) decides who gets it: a server that finds the lock held exits at once, and we try
# the next number. Why not let the server choose (-displayfd alone): then it takes no lock file
# and probes numbers by binding sockets, and where abstract sockets are not available (a CI
# sandbox) a second server binds over the first one's socket file and unlinks it when it stops,
# so the first server's app finds no display ("Failed to open display :0", seen in CI).
answers() {  # whether the X server $1 takes a client (xdpyinfo, from x11-utils, when installed)
  if ! command -v xdpyinfo >/dev/null; then return 0; fi
  DISPLAY=$1 xdpyinfo >/dev/null 2>&1 && return 0
  echo "with-xvfb: the server on $1 said it was ready but takes no client; trying another number" >&2
  return 1
}
start_server() {  # $1: display number; sets `server`, returns 0 once the server accepts clients
  : >"$dir/display"
  exec {numfd}>"$dir/display"
  # shellcheck disable=SC2086  # the server arguments are words on purpose
  Xvfb ":$1" -displayfd "$numfd" -nolisten tcp $server_args >"$dir/xvfb.log" 2>&1 &
  server=$!
  exec {numfd}>&-
  local i
  for ((i = 0; i < 1200; ++i)); do  # up to 60 s: a loaded machine starts the server slowly
    if [[ $(tail -c1 "$dir/display" 2>/dev/null | od -An -c | tr -d ' ') == '\n' ]]; then
      # Ready by its own word; and a client must get in before the command runs (a server that
      # reported ready and then lost its socket would leave the app without a display).
      [[ $(tr -d '[:space:]' <"$dir/display") == "$1" ]] && answers ":$1" && return 0
      break
    fi
    if ! kill -0 "$server" 2>/dev/null; then
      break
    fi
    sleep 0.05
  done
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  server=0
  return 1
}

number=""
first=$((200 + RANDOM % 600))  # spread parallel runs over the numbers so that few collide
for ((attempt = 0; attempt < 40; ++attempt)); do
  candidate=$((first + attempt))
  if start_server "$candidate"; then
    number=$candidate
    break
  fi
done
if [[ -z $number ]]; then
  echo "with-xvfb: Xvfb did not start on any of the displays :$first to :$((first + 39)); the last server's output:" >&2
  cat "$dir/xvfb.log" >&2
  exit 2
fi

DISPLAY=":$number" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM
trap 'kill -INT "$child" 2>/dev/null; wait "$child"; exit 130' INT
wait "$child"
rc=$?
if ((rc != 0)); then  # what the server saw, for a failure that may be the display's
  if ! kill -0 "$server" 2>/dev/null; then
    echo "with-xvfb: the X server on :$number had stopped before the command ended" >&2
  fi
  if ! answers ":$number" 2>/dev/null; then
    echo "with-xvfb: the X server on :$number takes no client now" >&2
  fi
  if [[ -s "$dir/xvfb.log" ]]; then
    echo "with-xvfb: the X server's output:" >&2
    tail -n 20 "$dir/xvfb.log" >&2
  fi
fi
exit $rc
