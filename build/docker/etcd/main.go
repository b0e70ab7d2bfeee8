// Command etcd is the etcd server of the local test image (scripts/docker-up.sh
// builds it on the host and copies it into the image): etcd 3.5.17, the version
// of the official image the tests use elsewhere, built from the Go module proxy,
// since Debian 12 ships 3.4.23 only.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
