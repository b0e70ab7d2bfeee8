package backend

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// HostPort checks one server address of a backend's URL or server list and
// returns it as host:port, with defaultPort added when it has none: "h",
// "h:1234", "[::1]:1234", "[::1]" and a bare "::1" are accepted; an empty
// address, a port that is not 1-65535, a missing host, or brackets that do
// not hold an IPv6 address are errors that quote the address.
func HostPort(s, defaultPort string) (string, error) {
	if s == "" {
		return "", errors.New("empty server address")
	}
	if host, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return "", fmt.Errorf("bad server address %q (want host:port, port 1-65535)", s)
		}
		return s, nil
	}
	if strings.ContainsAny(s, "[]") || strings.Count(s, ":") > 1 {
		// An IPv6 address without a port, bracketed ("[::1]") as a URL
		// writes it, or bare.
		ip := s
		if strings.HasPrefix(ip, "[") && strings.HasSuffix(ip, "]") {
			ip = ip[1 : len(ip)-1]
		}
		if net.ParseIP(ip) != nil && strings.Contains(ip, ":") && !strings.ContainsAny(ip, "[]") {
			return net.JoinHostPort(ip, defaultPort), nil
		}
		return "", fmt.Errorf("bad server address %q (want host:port, [IPv6]:port or [IPv6])", s)
	}
	if strings.Contains(s, ":") {
		return "", fmt.Errorf("bad server address %q (want host:port, port 1-65535)", s)
	}
	return net.JoinHostPort(s, defaultPort), nil
}
