#!/usr/bin/env bash
# docker-up.sh: make a private Docker engine and the local test-server image
# available on this machine. Idempotent and quiet; safe to run repeatedly.
#
#   1. installs docker.io and debootstrap with apt-get when missing (root, Debian/Ubuntu);
#   2. starts dockerd with no bridge, no iptables, data under $LOCKER_DOCKER_DIR and
#      its API on $LOCKER_DOCKER_SOCK (unless an engine already answers there);
#   3. builds the base image locker/debian-base:bookworm with debootstrap (when missing);
#   4. builds locker/testserver:<hash of build/docker> with `docker build --network host`
#      (when missing) and tags it locker/testserver:local.
#
# Prints "started" on stdout when it started dockerd itself (so the caller knows to stop
# it), nothing otherwise. Progress goes to stderr.
set -euo pipefail

DIR="${LOCKER_DOCKER_DIR:-/var/lib/locker-docker}"
SOCK="${LOCKER_DOCKER_SOCK:-/run/locker-docker.sock}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DOCKER_HOST="unix://$SOCK"

say() { echo "docker-up: $*" >&2; }
took() { echo "docker-up: ... done in $((SECONDS - $1))s" >&2; }
die() { echo "docker-up: ERROR: $*" >&2; exit 1; }

engine_up() { timeout 10 docker -H "unix://$SOCK" version >/dev/null 2>&1; }

# One set-up at a time (two `make test` at once must not start two engines).
mkdir -p "$DIR" 2>/dev/null || true
if command -v flock >/dev/null && [ -w "$DIR" ]; then
	exec 9>"$DIR/.docker-up.lock"
	flock 9
fi

started=""
if ! engine_up; then
	[ "$(id -u)" = 0 ] || die "no Docker engine answers at $SOCK and this is not root: start one (or set DOCKER_HOST), or run as root so this script can install one"
	# Besides the engine, a few servers run on the host, started by the tests
	# themselves: pgbouncer (postgres pooler tests, transaction and session
	# mode in front of the test server) and redis-server (the
	# redis TLS and Sentinel tests, which need configurations the test image
	# does not serve). Debian's packages do not start them here (no init).
	need=""
	for pair in dockerd:docker.io docker:docker.io debootstrap:debootstrap pgbouncer:pgbouncer redis-server:redis-server; do
		command -v "${pair%%:*}" >/dev/null || case " $need " in *" ${pair#*:} "*) ;; *) need="$need ${pair#*:}";; esac
	done
	if [ -n "$need" ]; then
		command -v apt-get >/dev/null || die "missing$need and no apt-get to install them (Debian/Ubuntu only)"
		t0=$SECONDS
		say "installing$need with apt-get"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq >"/tmp/locker-apt.log" 2>&1 || { tail -20 /tmp/locker-apt.log >&2; die "apt-get update failed (log: /tmp/locker-apt.log)"; }
		# shellcheck disable=SC2086
		apt-get install -y -qq $need >>"/tmp/locker-apt.log" 2>&1 || { tail -20 /tmp/locker-apt.log >&2; die "apt-get install$need failed (log: /tmp/locker-apt.log)"; }
		took "$t0"
	fi
	mkdir -p "$DIR"
	# A dockerd left from an earlier run with a dead socket: stop it first.
	if [ -f "$DIR/dockerd.pid" ] && kill -0 "$(cat "$DIR/dockerd.pid")" 2>/dev/null; then
		kill "$(cat "$DIR/dockerd.pid")" 2>/dev/null || true
		for _ in $(seq 50); do kill -0 "$(cat "$DIR/dockerd.pid")" 2>/dev/null || break; sleep 0.2; done
	fi
	rm -f "$SOCK"
	t0=$SECONDS
	say "starting dockerd (data root $DIR/data, socket $SOCK)"
	# --bridge=none: no docker0 and no bridge network; containers use host networking.
	setsid nohup dockerd \
		--data-root "$DIR/data" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" \
		-H "unix://$SOCK" --bridge=none --iptables=false --ip6tables=false \
		--ip-forward=false --ip-masq=false --userland-proxy=false \
		>"$DIR/dockerd.log" 2>&1 </dev/null 9>&- &
	for _ in $(seq 120); do engine_up && break; sleep 0.5; done
	engine_up || { tail -30 "$DIR/dockerd.log" >&2; die "dockerd did not answer within 60s (log: $DIR/dockerd.log)"; }
	started=1
	took "$t0"
fi

has_image() { docker image inspect "$1" >/dev/null 2>&1; }

BASE=locker/debian-base:bookworm
if ! has_image "$BASE"; then
	command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
	mirror="${LOCKER_DEBIAN_MIRROR:-}"
	if [ -z "$mirror" ]; then
		mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
	fi
	if [ -z "$mirror" ]; then
		mirror="$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -1 || true)"
	fi
	[ -n "$mirror" ] || die "cannot find the Debian mirror apt uses; set LOCKER_DEBIAN_MIRROR"
	t0=$SECONDS
	say "building $BASE with debootstrap from $mirror (about a minute)"
	tmp="$(mktemp -d /var/tmp/locker-debootstrap.XXXXXX)"
	trap 'rm -rf "$tmp"' EXIT
	debootstrap --variant=minbase bookworm "$tmp/root" "$mirror" >"$DIR/debootstrap.log" 2>&1 ||
		{ tail -20 "$DIR/debootstrap.log" >&2; die "debootstrap failed (log: $DIR/debootstrap.log)"; }
	# Keep the image's apt pointing at the same mirror (main + updates + security).
	printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" >"$tmp/root/etc/apt/sources.list"
	rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*
	tar -C "$tmp/root" -c . | docker import - "$BASE" >/dev/null || die "docker import failed"
	rm -rf "$tmp"
	trap - EXIT
	took "$t0"
fi

# The test-server image is tagged by a hash of everything in build/docker, so editing
# the Dockerfile or the entry script rebuilds it; integration/testserver computes the same tag.
hash="$(cd "$ROOT/build/docker" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)"
IMAGE="locker/testserver:$hash"
if ! has_image "$IMAGE"; then
	t0=$SECONDS
	# The build context: build/docker plus the etcd server, built here from
	# build/docker/etcd with the host's Go and module proxy (Debian's etcd is too old).
	bctx="$(mktemp -d /var/tmp/locker-image.XXXXXX)"
	trap 'rm -rf "$bctx"' EXIT
	cp -a "$ROOT/build/docker/." "$bctx/"
	say "building the etcd server of build/docker/etcd with $(go version | cut -d' ' -f3) (about a minute and a half)"
	(cd "$ROOT/build/docker/etcd" && CGO_ENABLED=0 go build -trimpath -o "$bctx/etcd-server" .) >"$DIR/etcd-build.log" 2>&1 ||
		{ tail -30 "$DIR/etcd-build.log" >&2; die "building etcd failed (log: $DIR/etcd-build.log)"; }
	say "building $IMAGE (redis, postgresql, mariadb, zookeeper, etcd; about two minutes)"
	docker build --network host -q -t "$IMAGE" "$bctx" >"$DIR/build.log" 2>&1 ||
		{ tail -30 "$DIR/build.log" >&2; die "docker build failed (log: $DIR/build.log)"; }
	rm -rf "$bctx"
	trap - EXIT
	took "$t0"
fi
docker tag "$IMAGE" locker/testserver:local
# Drop images of older build/docker versions that no container uses (saves ~1.3 GB each).
for old in $(docker images locker/testserver --format '{{.Repository}}:{{.Tag}}'); do
	case "$old" in "$IMAGE" | locker/testserver:local) continue ;; esac
	docker rmi "$old" >/dev/null 2>&1 || true
done

[ -z "$started" ] || echo started
