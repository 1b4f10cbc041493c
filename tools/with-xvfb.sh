#!/usr/bin/env bash
# Runs a command inside an Xvfb server of its own: DISPLAY names a server that this script started
# and stops afterwards.
#
# Why not `xvfb-run -a`: it looks for a free display number by the lock files in /tmp and then
# starts the server; two runs that look at the same moment (CTest runs GUI tests in parallel) both
# take :99, one server loses, and its app finds no display ("Failed to open display :99"). Here the
# server picks the number itself (-displayfd) at the moment it binds the socket, so parallel runs
# never share one.
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
exec {numfd}>"$dir/display"
# shellcheck disable=SC2086  # the server arguments are words on purpose
Xvfb -displayfd "$numfd" -nolisten tcp $server_args >"$dir/xvfb.log" 2>&1 &
server=$!
exec {numfd}>&-

number=""
for ((i = 0; i < 1200; ++i)); do  # up to 60 s: a loaded machine starts the server slowly
  if [[ $(tail -c1 "$dir/display" 2>/dev/null | od -An -c | tr -d ' ') == '\n' ]]; then
    number=$(tr -d '[:space:]' <"$dir/display")
    break
  fi
  if ! kill -0 "$server" 2>/dev/null; then
    break
  fi
  sleep 0.05
done
if [[ ! $number =~ ^[0-9]+$ ]]; then
  echo "with-xvfb: Xvfb did not start (no display number after 60 s); its output:" >&2
  cat "$dir/xvfb.log" >&2
  exit 2
fi

DISPLAY=":$number" "$@" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null; wait "$child"; exit 143' TERM
trap 'kill -INT "$child" 2>/dev/null; wait "$child"; exit 130' INT
wait "$child"
exit $?
