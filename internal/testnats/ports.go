package testnats

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FreeAddr is a loopback host:port nothing listens on right now, for a
// server that must be told its port before it starts (cluster routes,
// restarts on the same address).
//
// It is chosen below the kernel's ephemeral range: a port picked with
// ":0" and closed again can be taken by any outgoing connection (a route,
// a client) before the server binds it, which made parallel tests fail
// with "address already in use". Below that range only servers told the
// port explicitly bind, so a clash needs two tests to draw the same
// random port in the instant between the check and the bind.
func FreeAddr(t testing.TB) string {
	t.Helper()
	low, high := belowEphemeral()
	for range 200 {
		addr := "127.0.0.1:" + strconv.Itoa(low+rand.IntN(high-low))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		return addr
	}
	t.Fatalf("no free loopback port in %d-%d after 200 tries", low, high-1)
	return ""
}

// belowEphemeral is the port range [low, high) FreeAddr draws from: the
// 16,000 ports under the start of ip_local_port_range (32768 when it
// cannot be read).
func belowEphemeral() (low, high int) {
	high = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var lo, hi int
		if n, _ := fmt.Sscan(strings.TrimSpace(string(b)), &lo, &hi); n == 2 && lo > 2048 {
			high = lo
		}
	}
	low = max(1024, high-16000)
	return low, high
}
