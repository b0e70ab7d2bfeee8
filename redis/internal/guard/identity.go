package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	goredis "github.com/redis/go-redis/v9"
)

// What a server is.
//
// Two Redlock nodes are the same server when the same Redis process answers
// both, whatever their addresses (127.0.0.1:P and localhost:P, a proxy, a
// DNS alias, another database number of one server). The server says which
// process it is in INFO server: run_id, 40 random hex digits drawn at start.
// Two nodes that report one run_id at once are one process, for certain;
// a run_id changes when the server restarts, so an identity learnt before a
// restart is compared only with identities read after it by a caller that
// knows (see the redlock package's vetting). Where INFO is not allowed to
// the ACL user, the server's identity is a random value the first caller
// stored under a key of the Locker's prefix (SET NX, then GET): the same for
// every name of one database of one server, and kept across restarts with
// persistence, but not shared by two database numbers of one server.

// Probe reads a server's maxmemory-policy and identity in the pipeline of
// another request (one round trip).
type Probe struct {
	cfg  *goredis.MapStringStringCmd // nil when the policy is not asked
	info *goredis.StringCmd
}

// AddProbe queues the reads of a Probe on p: CONFIG GET maxmemory-policy
// when policy is set, and INFO server.
func AddProbe(ctx context.Context, p goredis.Pipeliner, policy bool) *Probe {
	pr := &Probe{}
	if policy {
		pr.cfg = p.ConfigGet(ctx, "maxmemory-policy")
	}
	pr.info = p.Info(ctx, "server")
	return pr
}

// Vetting is what a Probe found.
type Vetting struct {
	Policy string // "" when not asked, or the server would not tell
	ID     string // "run_id:<hex>", "key:<random>", or "" when the server would not tell
}

// Result completes the probe once its pipeline ran: the fallbacks (INFO
// memory when CONFIG is refused, the identity key idKey when INFO is) take
// requests of their own on c. An error is a failed connection or a passing
// state of the server.
func (pr *Probe) Result(ctx context.Context, c goredis.Cmdable, idKey string) (Vetting, error) {
	var v Vetting
	if pr.cfg != nil {
		m, err := pr.cfg.Result()
		p, err := policyFrom(ctx, c, m, err)
		if err != nil {
			return v, err
		}
		v.Policy = p
	}
	info, err := pr.info.Result()
	switch {
	case err == nil:
		if id, ok := infoField(info, "run_id"); ok && id != "" {
			v.ID = "run_id:" + id
			return v, nil
		}
	case !Refused(err):
		return v, err
	}
	id, err := keyID(ctx, c, idKey)
	if err != nil {
		return v, err
	}
	v.ID = id
	return v, nil
}

// keyID is the identity of a server that will not say its run_id: the
// value under idKey, stored by the first caller. "" when the server refuses
// that too.
func keyID(ctx context.Context, c goredis.Cmdable, idKey string) (string, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	var get *goredis.StringCmd
	_, _ = c.Pipelined(ctx, func(p goredis.Pipeliner) error {
		p.SetNX(ctx, idKey, hex.EncodeToString(b), 0)
		get = p.Get(ctx, idKey)
		return nil
	})
	id, err := get.Result()
	switch {
	case err == nil && id != "":
		return "key:" + id, nil
	case err == nil || err == goredis.Nil || Refused(err):
		return "", nil
	default:
		return "", err
	}
}
