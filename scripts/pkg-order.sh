#!/usr/bin/env bash
# pkg-order.sh PATTERN...: the packages `go list PATTERN...` names, the
# longest-running integration packages first, then the others in go list's
# order. go test starts packages in the order they are named, at most -p at
# a time: named in import-path order, the longest (integration/sqltable)
# started only after six others and ended the run about 150 s after the rest.
# The order is from the package times of a `make test` run (see README,
# "Running the tests"); a package missing from LONGEST keeps its place.
set -euo pipefail
LONGEST=(sqltable zookeeper redis etcd redlock postgres)
mapfile -t pkgs < <(${GO:-go} list "$@")
first() {
	local p=$1 f
	for f in "${LONGEST[@]}"; do
		[[ $p == */integration/$f ]] && return 0
	done
	return 1
}
for f in "${LONGEST[@]}"; do
	for p in "${pkgs[@]}"; do
		[[ $p == */integration/$f ]] && echo "$p"
	done
done
for p in "${pkgs[@]}"; do
	first "$p" || echo "$p"
done
