package testserver

// ProxyGoroutines names functions of the in-process fault proxy (Toxiproxy)
// that its connection goroutines run. A harness that puts a Proxy between a
// Locker and its server passes them as conformance.Harness.IgnoreGoroutines:
// a proxy's links can outlive the Locker's Close by a moment (Toxiproxy tears
// them down asynchronously, and a link blocked on a full pipe stays until the
// proxy stops), and they are the test's goroutines, not the Locker's.
var ProxyGoroutines = []string{
	"github.com/Shopify/toxiproxy/v2.(*ToxicLink).read",
	"github.com/Shopify/toxiproxy/v2.(*ToxicLink).write",
	"github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run",
	"github.com/Shopify/toxiproxy/v2.(*Proxy).server",
	"github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1",
}
