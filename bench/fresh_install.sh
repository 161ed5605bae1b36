#!/usr/bin/env bash
# fresh_install.sh: the README's install, as written, on a fresh python:3.11-slim container (no
# C compiler), without and then with the README's Debian prerequisites line. Needs a Docker engine
# (as root: bash ../shared/tools/docker-lab.sh). Results: bench/RESULTS.md "Docker image and a
# fresh machine".
#
#   bash bench/fresh_install.sh [SWARM_SECONDS]    # default 900: how long `pulse-node swarm` may run
#
# The checkout copied in is `git archive HEAD` (commit first). The README lines are read from
# README.md: the `apt-get` prerequisites line (run as root, so its `sudo ` is dropped: the
# container has no sudo) and the first-run line ending in `pulse-node swarm`, which runs under
# `timeout -s INT` (Ctrl+C after SWARM_SECONDS). If this machine's pip has a local find-links
# directory (PIP_FIND_LINKS, here the CPU torch wheel), it is mounted and used in the container too,
# as pip on this machine would; elsewhere pip downloads torch from PyPI. Ends with one JSON line.
set -uo pipefail
cd "$(dirname "$0")/.."
swarm_s=${1:-900}
image=python:3.11-slim
prereq=$(grep -m1 -E '^sudo apt-get ' README.md | sed 's/#.*//; s/sudo //g')
first=$(grep -m1 -E '^python3 -m venv .*pulse-node swarm$' README.md)
[ -n "$prereq" ] && [ -n "$first" ] || { echo "README lines not found" >&2; exit 2; }
tar=$(mktemp --suffix=.tar); git archive --prefix=pulse-node/ HEAD >"$tar"
mounts=(); envs=()
if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ]; then
  mounts=(-v "$PIP_FIND_LINKS:$PIP_FIND_LINKS:ro"); envs=(-e "PIP_FIND_LINKS=$PIP_FIND_LINKS")
fi
names=()
cleanup() { for n in "${names[@]}"; do docker rm -f "$n" >/dev/null 2>&1; done; rm -f "$tar"; }
trap cleanup EXIT

# run_case NAME SCRIPT: a new container with the checkout in /root/pulse-node and the README lines
# in /root/prereq.sh and /root/first.sh; SCRIPT runs in the checkout; sets rc and secs
run_case() {
  local name=pulse-fresh-$1-$$
  names+=("$name")
  docker run -d --name "$name" "${mounts[@]}" "${envs[@]}" -w /root "$image" sleep infinity >/dev/null
  docker cp "$tar" "$name:/root/checkout.tar" && docker exec "$name" tar -xf /root/checkout.tar -C /root
  docker exec -i "$name" sh -c 'cat >/root/prereq.sh' <<<"$prereq"
  docker exec -i "$name" sh -c 'cat >/root/first.sh' <<<"$first"
  echo "=== $1: $2"
  local t0=$SECONDS
  docker exec -w /root/pulse-node "$name" bash -c "$2" >"/tmp/fresh-$1.log" 2>&1
  rc=$?; secs=$((SECONDS - t0))
  echo "--- exit $rc after ${secs}s; last lines of /tmp/fresh-$1.log:"
  tail -n 25 "/tmp/fresh-$1.log"
}

docker run --rm "$image" sh -c 'for c in gcc cc clang; do command -v $c; done; test -e /usr/include/gmp.h && echo gmp.h' \
  | grep -q . && { echo "$image has a compiler or gmp.h: not a fresh machine" >&2; exit 2; }
run_case no-compiler "bash /root/first.sh"
rc_bare=$rc secs_bare=$secs
run_case with-prereqs "bash /root/prereq.sh >/tmp/apt.log && command -v gcc && timeout -s INT $swarm_s bash /root/first.sh"
rc_prereq=$rc secs_prereq=$secs
# 124: timeout's Ctrl+C ended the still-running swarm (the install and start succeeded)
printf '{"no_compiler": {"exit": %d, "seconds": %d, "fastecdsa_build_failed": %s}, "with_prereqs": {"exit": %d, "seconds": %d, "swarm_ran_until_ctrl_c": %s}}\n' \
  "$rc_bare" "$secs_bare" "$(grep -q 'Failed to build fastecdsa\|Could not build wheels for fastecdsa\|fastecdsa.*did not run successfully' /tmp/fresh-no-compiler.log && echo true || echo false)" \
  "$rc_prereq" "$secs_prereq" "$([ "$rc_prereq" = 124 ] && echo true || echo false)"
