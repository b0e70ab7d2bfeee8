#!/usr/bin/env bash
# with-servers.sh CMD [ARG...]: run CMD where integration/testserver finds a Docker engine,
# then remove the test containers and stop what this script started. Exits with CMD's
# exit code.
#
# Engine, in order:
#   1. DOCKER_HOST, when set and answering (profile LOCKER_TEST_IMAGES, default official,
#      or local when it is this project's own engine);
#   2. the project's own engine on $LOCKER_DOCKER_SOCK (/run/locker-docker.sock),
#      profile local (images are built when missing);
#   3. the default engine (`docker version` answers), profile official;
#   4. as root on Debian/Ubuntu: scripts/docker-up.sh installs docker.io and debootstrap,
#      starts the project's engine, builds the local images; profile local; the engine
#      is stopped again at the end;
#   5. none: CMD runs anyway (servers may come from LOCKER_TEST_* variables; otherwise
#      tests skip, or fail with LOCKER_REQUIRE_SERVERS=1).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOCK="${LOCKER_DOCKER_SOCK:-/run/locker-docker.sock}"
OWN="unix://$SOCK"

say() { echo "with-servers: $*" >&2; }
answers() { command -v docker >/dev/null 2>&1 && timeout 10 docker "$@" version >/dev/null 2>&1; }

started=""
if [ -n "${DOCKER_HOST:-}" ] && answers; then
	if [ "$DOCKER_HOST" = "$OWN" ]; then
		export LOCKER_TEST_IMAGES="${LOCKER_TEST_IMAGES:-local}"
	fi
elif answers -H "$OWN"; then
	export DOCKER_HOST="$OWN" LOCKER_TEST_IMAGES="${LOCKER_TEST_IMAGES:-local}"
elif [ -z "${DOCKER_HOST:-}" ] && answers; then
	export LOCKER_TEST_IMAGES="${LOCKER_TEST_IMAGES:-official}"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	out="$("$ROOT/scripts/docker-up.sh")" || { say "could not set up a Docker engine (see above)"; exit 1; }
	[ "$out" = started ] && started=1
	export DOCKER_HOST="$OWN" LOCKER_TEST_IMAGES="${LOCKER_TEST_IMAGES:-local}"
else
	say "no Docker engine answers and this is not root on Debian/Ubuntu: tests get servers only from LOCKER_TEST_* variables"
fi
if [ "${LOCKER_TEST_IMAGES:-}" = local ]; then
	export TESTCONTAINERS_RYUK_DISABLED=true
	if [ -z "$started" ]; then
		# An engine that already ran: make sure the current images exist.
		"$ROOT/scripts/docker-up.sh" >/dev/null || { say "could not build the local images (see above)"; exit 1; }
	fi
fi
[ -z "${DOCKER_HOST:-}" ] || say "Docker engine ${DOCKER_HOST}, images ${LOCKER_TEST_IMAGES:-official}"

cleanup() {
	if answers; then
		# Containers of test binaries that have ended (a crash or a timeout skips their
		# own clean-up); containers of test runs still going on are left alone.
		boot="$(hostname)/$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
		docker ps -a --filter label=org.go-locker.test --filter "label=org.go-locker.test.boot=$boot" \
			--format '{{.ID}} {{.Label "org.go-locker.test.pid"}}' 2>/dev/null |
			while read -r id pid; do
				if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
					docker rm -f -v "$id" >/dev/null 2>&1 || true
				fi
			done
	fi
	if [ -n "$started" ]; then
		"$ROOT/scripts/docker-down.sh"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$@"
