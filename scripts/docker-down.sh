#!/usr/bin/env bash
# docker-down.sh: remove every test container (label org.go-locker.test) from the
# project's own Docker engine and stop that engine (started by scripts/docker-up.sh).
# Images and the data root stay, so the next start is quick.
set -uo pipefail
DIR="${LOCKER_DOCKER_DIR:-/var/lib/locker-docker}"
SOCK="${LOCKER_DOCKER_SOCK:-/run/locker-docker.sock}"
export DOCKER_HOST="unix://$SOCK"

if timeout 10 docker version >/dev/null 2>&1; then
	ids="$(docker ps -aq --filter label=org.go-locker.test)"
	[ -z "$ids" ] || docker rm -f -v $ids >/dev/null 2>&1 || true
fi
if [ -f "$DIR/dockerd.pid" ]; then
	pid="$(cat "$DIR/dockerd.pid")"
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid"
		for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		if kill -0 "$pid" 2>/dev/null; then
			echo "docker-down: dockerd ($pid) did not stop in 30s; killing it" >&2
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$DIR/dockerd.pid"
fi
rm -f "$SOCK"
# dockerd leaves its bind mounts of the data and exec roots behind; drop them (deepest
# first) once no dockerd uses them.
if [ ! -f "$DIR/dockerd.pid" ]; then
	awk -v d="$DIR/" 'index($2, d) == 1 {print $2}' /proc/mounts 2>/dev/null | sort -r |
		while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
fi
