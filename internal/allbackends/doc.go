// Package allbackends holds tests that open every backend of the module at
// once (the shared URL parameters, say). They live here, in a package no
// program imports, and not beside the code they test in backend: go mod tidy
// reads the tests of the packages a consumer imports, so a test in backend
// that imports every backend would put every backend's client library
// (go-redis, pgx, etcd, ZooKeeper, the SQL drivers) into the go.sum of a
// program that imports only memlock (integration/deps checks this).
package allbackends
