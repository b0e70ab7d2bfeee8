package testserver

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterNodes is the number of masters RedisCluster starts.
const clusterNodes = 3

// startRedisCluster starts three cluster-enabled Redis masters in one container, each
// on 127.0.0.1 with its own port, assigns the 16384 slots and makes them meet.
func startRedisCluster() ([]*Server, error) {
	e, err := getEngine()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 {
		ports, err := freePorts(2 * clusterNodes)
		if err != nil {
			return nil, err
		}
		// Cluster bus ports are given explicitly: port+10000 may be taken.
		data, bus := ports[:clusterNodes], ports[clusterNodes:]
		var sp spec
		servers := make([]*Server, clusterNodes)
		for i, p := range data {
			servers[i] = &Server{kind: kindRedisCluster, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p))}
		}
		if e.profile == profileLocal {
			sp = spec{image: e.image, cmd: []string{"redis-cluster"}}
			for _, p := range ports {
				sp.cmd = append(sp.cmd, strconv.Itoa(p))
			}
		} else {
			// Inside the container the nodes listen on the same port numbers that are
			// published on the host, and announce 127.0.0.1: they meet each other over
			// the container's loopback and clients reach them over the host's.
			var sh []string
			for i := range clusterNodes {
				daemon := "yes"
				if i == clusterNodes-1 {
					daemon = "no"
				}
				cmd := fmt.Sprintf("redis-server --port %d --cluster-enabled yes --cluster-port %d "+
					"--cluster-config-file /data/nodes-%d.conf --cluster-announce-ip 127.0.0.1 "+
					"--cluster-node-timeout 5000 --save '' --appendonly no --protected-mode no --daemonize %s",
					data[i], bus[i], data[i], daemon)
				if daemon == "no" {
					cmd = "exec " + cmd
				}
				sh = append(sh, cmd)
			}
			sp = spec{image: officialImage(kindRedis), entrypoint: []string{"sh", "-c", strings.Join(sh, " && ")}, bind: map[int]string{}}
			for _, p := range data {
				sp.bind[p] = strconv.Itoa(p) + "/tcp"
			}
		}
		out, err := runServers(e, kindRedisCluster, sp, servers, func(ctx context.Context) error {
			return formCluster(ctx, data, bus)
		})
		if err == nil {
			return out, nil
		}
		lastErr = err
		if !isExited(err) {
			return nil, err
		}
	}
	return nil, lastErr
}

// formCluster assigns an equal share of the slots to each node and makes the nodes meet.
func formCluster(ctx context.Context, data, bus []int) error {
	const slots = 16384
	clients := make([]*redis.Client, len(data))
	for i, p := range data {
		clients[i] = redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), DialTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
		defer clients[i].Close()
	}
	for i, c := range clients {
		lo := i * slots / len(clients)
		hi := (i+1)*slots/len(clients) - 1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return fmt.Errorf("redis cluster: ADDSLOTSRANGE %d %d on node %d: %w", lo, hi, i, err)
		}
	}
	// Distinct config epochs before the nodes meet, as redis-cli --cluster
	// create gives them. Left at 0 each, the nodes resolve the collision
	// themselves, one bump at a time, for seconds after the cluster reports
	// ok; a slot moved meanwhile (CLUSTER SETSLOT ... NODE, which bumps the
	// importing node's epoch only when it is not the highest already) can be
	// taken back by its old master's gossip with a higher epoch, and the two
	// masters then answer MOVED to each other for that slot for good. The
	// highest epoch given is clusterNodes, which a node must have heard of
	// to count as ready (see ping in kinds.go).
	for i, c := range clients {
		if err := c.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return fmt.Errorf("redis cluster: SET-CONFIG-EPOCH %d on node %d: %w", i+1, i, err)
		}
	}
	for i := 1; i < len(clients); i++ {
		if err := clients[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", data[i], bus[i]).Err(); err != nil {
			return fmt.Errorf("redis cluster: MEET node %d: %w", i, err)
		}
	}
	return nil
}
