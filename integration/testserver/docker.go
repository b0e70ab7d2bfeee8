package testserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
)

// Labels put on every container this package starts, so leftovers can be found and
// removed (`docker rm -f $(docker ps -aq --filter label=org.go-locker.test)`).
const (
	LabelTest = "org.go-locker.test"
	labelPID  = "org.go-locker.test.pid"
	labelBoot = "org.go-locker.test.boot"
	labelKind = "org.go-locker.test.kind"
)

// The private engine scripts/docker-up.sh starts, used when DOCKER_HOST is unset and no
// default engine socket exists.
const lockerDockerSock = "/run/locker-docker.sock"

// Image profiles.
const (
	profileOfficial = "official"
	profileLocal    = "local"
)

// engine is the Docker engine and the way containers are made on it.
type engine struct {
	profile  string
	provider *testcontainers.DockerProvider
	api      client.APIClient
	image    string // the local profile's image
}

var (
	engineOnce sync.Once
	engineVal  *engine
	engineErr  error
)

// getEngine finds a Docker engine that answers, once per test binary.
func getEngine() (*engine, error) {
	engineOnce.Do(func() { engineVal, engineErr = connectEngine() })
	return engineVal, engineErr
}

func connectEngine() (*engine, error) {
	profile := strings.TrimSpace(os.Getenv(EnvImages))
	if os.Getenv("DOCKER_HOST") == "" && !exists("/var/run/docker.sock") && exists(lockerDockerSock) {
		// The engine `make test` / scripts/docker-up.sh starts on machines without one.
		_ = os.Setenv("DOCKER_HOST", "unix://"+lockerDockerSock)
		if profile == "" {
			profile = profileLocal
		}
	}
	if profile == "" {
		profile = profileOfficial
	}
	if profile != profileOfficial && profile != profileLocal {
		return nil, fmt.Errorf("%s=%q: want %q or %q", EnvImages, profile, profileOfficial, profileLocal)
	}
	if profile == profileLocal && os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		// Ryuk needs its image from a registry and a bridge network; the local profile
		// has neither. Containers are removed by Main, the next run, and `make test`.
		_ = os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	tclog.SetDefault(quietLogger{})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var opts []testcontainers.DockerProviderOption
	if profile == profileLocal {
		// Host networking: testcontainers must not create a bridge network. DefaultNetwork
		// is deprecated but is the documented way v0.45 runs containers on "host".
		//lint:ignore SA1019 no replacement in testcontainers-go v0.45
		opts = append(opts, testcontainers.DefaultNetwork("host"))
	}
	opts = append(opts, testcontainers.WithLogger(quietLogger{}))
	p, err := newProvider(opts...)
	if err != nil {
		return nil, fmt.Errorf("no Docker engine answers: %w", err)
	}
	// testcontainers closes the provider's client after most of its calls
	// (testcontainers-go issue 2776), which closes every idle connection of
	// its transport; this provider is shared by every server of the test
	// binary, started and stopped many at once, and a request that was
	// taking one of those connections failed ("http: CloseIdleConnections
	// called"). Its Close is made a no-op: the transport bounds its idle
	// connections (and their idle time) by itself, and the process ends
	// them.
	p.SetClient(keepOpen{p.Client()})
	e := &engine{profile: profile, provider: p, api: p.Client()}
	if _, err := e.api.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		return nil, fmt.Errorf("no Docker engine answers: %w", err)
	}
	if profile == profileOfficial {
		nets, err := e.api.NetworkList(ctx, client.NetworkListOptions{})
		if err != nil {
			return nil, fmt.Errorf("docker network list: %w", err)
		}
		found := false
		for _, n := range nets.Items {
			if n.Name == "bridge" || n.Name == "podman" {
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("%s=official needs the engine's default bridge network, which this engine lacks (it was started with --bridge=none?); use %s=local with images from scripts/docker-up.sh", EnvImages, EnvImages)
		}
	} else {
		e.image = localImage()
		if _, err := e.api.ImageInspect(ctx, e.image); err != nil {
			return nil, fmt.Errorf("%s=local: image %s is missing: build it with scripts/docker-up.sh (or `make test`): %w", EnvImages, e.image, err)
		}
	}
	reapDead(ctx, e.api)
	return e, nil
}

// keepOpen is a Docker client whose Close does nothing (see connectEngine).
type keepOpen struct{ client.APIClient }

func (keepOpen) Close() error { return nil }

// newProvider makes the testcontainers provider; it can panic deep inside on broken
// environments, which must become an error here, not a crashed test binary.
func newProvider(opts ...testcontainers.DockerProviderOption) (p *testcontainers.DockerProvider, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	return testcontainers.NewDockerProvider(opts...)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// localImage is the image scripts/docker-up.sh builds: locker/testserver:<hash of
// build/docker>, or LOCKER_TEST_LOCAL_IMAGE, or locker/testserver:local when the
// build directory cannot be found from here.
func localImage() string {
	if v := strings.TrimSpace(os.Getenv("LOCKER_TEST_LOCAL_IMAGE")); v != "" {
		return v
	}
	_, file, _, ok := runtime.Caller(0)
	if ok {
		dir := filepath.Join(filepath.Dir(file), "..", "..", "build", "docker")
		if h, err := hashDir(dir); err == nil {
			return "locker/testserver:" + h
		}
	}
	return "locker/testserver:local"
}

// hashDir computes the same tag as scripts/docker-up.sh:
// find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12
func hashDir(dir string) (string, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(dir, path)
			if err != nil {
				return err
			}
			files = append(files, "./"+filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", errors.New("no files")
	}
	sort.Strings(files)
	var list bytes.Buffer
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(&list, "%s  %s\n", hex.EncodeToString(sum[:]), f)
	}
	sum := sha256.Sum256(list.Bytes())
	return hex.EncodeToString(sum[:])[:12], nil
}

// bootID tells this machine's boot apart, so only containers of dead test binaries of
// this very machine are reaped.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	h, _ := os.Hostname()
	return h + "/" + strings.TrimSpace(string(b))
}

// reapDead removes containers left by test binaries of this machine that have died
// without removing them (a panic, a -timeout, a kill).
func reapDead(ctx context.Context, api client.APIClient) {
	list, err := api.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelTest).Add("label", labelBoot+"="+bootID()),
	})
	if err != nil {
		return
	}
	for _, c := range list.Items {
		pid, err := strconv.Atoi(c.Labels[labelPID])
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		_, _ = api.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// --- containers -------------------------------------------------------------------

// spec says how to run one server kind in one profile.
type spec struct {
	image      string
	entrypoint []string
	cmd        []string
	env        map[string]string
	// bind maps a host port (on 127.0.0.1) to a container port, official profile only.
	bind map[int]string
	// files maps a path in the container to a file on the host, copied in
	// (owned by root, mode 0644) before the container starts.
	files map[string]string
	// ctrFiles are copied into the container before it starts, as given
	// (certificates with their modes).
	ctrFiles []testcontainers.ContainerFile
}

// live tracks every container this process started and has not removed yet.
var (
	liveMu sync.Mutex
	live   = map[*testcontainers.DockerContainer]struct{}{}
)

// runContainer creates and starts a container for sp.
func (e *engine) runContainer(ctx context.Context, kind string, sp spec) (*testcontainers.DockerContainer, error) {
	req := testcontainers.ContainerRequest{
		Image:      sp.image,
		Entrypoint: sp.entrypoint,
		Cmd:        sp.cmd,
		Env:        sp.env,
		Files:      sp.ctrFiles,
		Labels: map[string]string{
			LabelTest: "1",
			labelPID:  strconv.Itoa(os.Getpid()),
			labelBoot: bootID(),
			labelKind: kind,
		},
	}
	for ctrPath, hostPath := range sp.files {
		req.Files = append(req.Files, testcontainers.ContainerFile{HostFilePath: hostPath, ContainerFilePath: ctrPath, FileMode: 0o644})
	}
	if e.profile == profileLocal {
		req.HostConfigModifier = func(hc *container.HostConfig) {
			hc.NetworkMode = "host"
		}
	} else {
		// Publish each port on 127.0.0.1 at a host port chosen here, so the address
		// stays the same across Stop/Start.
		pm := network.PortMap{}
		for host, ctrPort := range sp.bind {
			p, err := network.ParsePort(ctrPort)
			if err != nil {
				return nil, err
			}
			req.ExposedPorts = append(req.ExposedPorts, ctrPort)
			pm[p] = append(pm[p], network.PortBinding{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(host)})
		}
		req.HostConfigModifier = func(hc *container.HostConfig) {
			hc.PortBindings = pm
		}
	}
	c, err := e.provider.CreateContainer(ctx, req)
	dc, ok := c.(*testcontainers.DockerContainer)
	if ok && dc != nil {
		track(dc)
	}
	if err != nil {
		if ok && dc != nil {
			removeContainer(dc)
		}
		return nil, fmt.Errorf("create %s container from %s: %w", kind, sp.image, err)
	}
	if !ok || dc == nil {
		return nil, fmt.Errorf("unexpected container type %T", c)
	}
	if err := dc.Start(ctx); err != nil {
		removeContainer(dc)
		return nil, fmt.Errorf("start %s container from %s: %w", kind, sp.image, err)
	}
	return dc, nil
}

func track(c *testcontainers.DockerContainer) {
	liveMu.Lock()
	live[c] = struct{}{}
	liveMu.Unlock()
}

// removeContainer removes a container (and its anonymous volumes) for good.
func removeContainer(c *testcontainers.DockerContainer) {
	if c == nil {
		return
	}
	liveMu.Lock()
	delete(live, c)
	liveMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	// Unpause first: a paused container cannot be stopped gracefully.
	if e, err := getEngine(); err == nil {
		_, _ = e.api.ContainerUnpause(ctx, c.GetContainerID(), client.ContainerUnpauseOptions{})
		_, _ = e.api.ContainerRemove(ctx, c.GetContainerID(), client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		return
	}
	_ = c.Terminate(ctx)
}

// terminate removes the container behind s (a no-op for servers from env vars).
func terminate(s *Server) {
	if s == nil || s.ctr == nil {
		return
	}
	removeContainer(s.ctr)
}

// removeAll removes every container this process started and still has.
func removeAll() {
	liveMu.Lock()
	all := make([]*testcontainers.DockerContainer, 0, len(live))
	for c := range live {
		all = append(all, c)
	}
	liveMu.Unlock()
	var wg sync.WaitGroup
	for _, c := range all {
		wg.Add(1)
		go func() { defer wg.Done(); removeContainer(c) }()
	}
	wg.Wait()
}

func containerRunning(ctx context.Context, c *testcontainers.DockerContainer) (bool, error) {
	st, err := c.State(ctx)
	if err != nil {
		return false, err
	}
	if st.Paused {
		return false, errors.New("the container is paused; Resume it first")
	}
	return st.Running, nil
}

func killContainer(ctx context.Context, c *testcontainers.DockerContainer) error {
	e, err := getEngine()
	if err != nil {
		return err
	}
	if _, err := e.api.ContainerKill(ctx, c.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		return err
	}
	// Wait until the engine has seen it die, so a Start right after works.
	for {
		st, err := c.State(ctx)
		if err != nil {
			return err
		}
		if !st.Running {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func pauseContainer(ctx context.Context, c *testcontainers.DockerContainer, pause bool) error {
	e, err := getEngine()
	if err != nil {
		return err
	}
	if pause {
		// runc freezes the container's cgroup and gives up, thawing it,
		// when a process does not stop in time (one in a disk wait, as a
		// database's fsync under load): "unable to freeze". Nothing was
		// paused then; try again, a few times.
		for try := 1; ; try++ {
			_, err = e.api.ContainerPause(ctx, c.GetContainerID(), client.ContainerPauseOptions{})
			if err == nil || try == 5 || !strings.Contains(err.Error(), "unable to freeze") {
				break
			}
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Duration(try) * 50 * time.Millisecond): // a back-off before asking the daemon again
			}
		}
	} else {
		_, err = e.api.ContainerUnpause(ctx, c.GetContainerID(), client.ContainerUnpauseOptions{})
	}
	return err
}

// containerLogs returns the end of a container's output, for error messages.
func containerLogs(c *testcontainers.DockerContainer) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := c.Logs(ctx)
	if err != nil {
		return ""
	}
	defer r.Close()
	b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. The listeners are held
// until all are chosen; the server binding them later can still race with another
// process, which startServer handles by retrying with new ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		p := l.Addr().(*net.TCPAddr).Port
		ports = append(ports, p)
	}
	return ports, nil
}
