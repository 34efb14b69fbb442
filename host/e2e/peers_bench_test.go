package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkPeers puts the host beside the proxies it is measured against:
// the same wrk load (PLUGHOST_PEERS_THREADS threads, default 2, and
// PLUGHOST_PEERS_CONNS connections, default 64) on GET of a tiny JSON
// answer through host → hello, nginx → a standalone Go server of the same
// handler (testdata/peerserver), HAProxy → that server, and the server
// alone. Each runs PLUGHOST_PEERS_DURATION (default 4s) per round, the
// four taking turns in PLUGHOST_PEERS_ROUNDS rounds (default 3) after a
// warm-up, the first of them moving on by one each round. It prints each
// round's requests/s, p99 and CPU per request (of every process serving
// that side; wrk's own is left out), the host's ratios to nginx and HAProxy,
// the machine's steal and load average, and the medians. It fails only when
// a side answers wrongly or a tool is missing, never on a figure; make
// bench-peers installs wrk, nginx and HAProxy first. Only 127.0.0.1 is
// loaded, and every process it starts is killed when it ends.
func BenchmarkPeers(b *testing.B) {
	for _, tool := range []string{"wrk", "nginx", "haproxy"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is not installed (make bench-peers installs it): %v", tool, err)
		}
	}
	dur := envDuration(b, "PLUGHOST_PEERS_DURATION", 4*time.Second)
	rounds := envInt(b, "PLUGHOST_PEERS_ROUNDS", 3, 20)
	threads := envInt(b, "PLUGHOST_PEERS_THREADS", 2, 64)
	conns := envInt(b, "PLUGHOST_PEERS_CONNS", 64, 4096)

	server := startPeer(b, "peerserver", filepath.Join(bins.dir, "peerserver"), "-listen", freeAddr(b))
	waitListening(b, server.addr)
	nginx := startNginx(b, server.addr)
	haproxy := startHAProxy(b, server.addr)
	h := startBenchHost(b, benchHostConfig(b.TempDir()))
	hostPids := []int{h.cmd.Process.Pid, h.pluginPid(b, "hello")}

	sides := []*peerSide{
		{name: "host → hello", url: h.ingress + "/hello/", pids: func() []int { return hostPids }},
		{name: "nginx → server", url: "http://" + nginx.addr + "/", pids: func() []int { return append(nginx.tree(), server.pid) }},
		{name: "haproxy → server", url: "http://" + haproxy.addr + "/", pids: func() []int { return []int{haproxy.pid, server.pid} }},
		{name: "server", url: "http://" + server.addr + "/", pids: func() []int { return []int{server.pid} }},
	}
	want := getBody(b, sides[len(sides)-1].url)
	for _, s := range sides {
		if got := getBody(b, s.url); got != want {
			b.Fatalf("GET via %s = %q, want %q as the server answers", s.name, got, want)
		}
		runWrk(b, s.url, threads, conns, time.Second) // warm-up
	}

	var out strings.Builder
	fmt.Fprintf(&out, "\nwrk -t%d -c%d -d%v --latency, GET of a tiny JSON answer; %d rounds, the sides taking turns; %d CPUs\n",
		threads, conns, dur, rounds, runtime.NumCPU())
	var hostNginx, hostHAProxy, steals []float64
	b.ResetTimer()
	for round := range rounds {
		m0, ok := machineCPU()
		load := loadavg()
		for i := range sides {
			s := sides[(round+i)%len(sides)]
			cpu0 := pidsCPU(b, s.pids())
			r := runWrk(b, s.url, threads, conns, dur)
			r.cpuPerReq = (pidsCPU(b, s.pids()) - cpu0) / time.Duration(max(r.requests, 1))
			s.results = append(s.results, r)
		}
		steal := -1.0
		if m1, ok1 := machineCPU(); ok && ok1 {
			_, _, steal = m1.sub(m0).shares()
		}
		steals = append(steals, steal)
		hn := sides[0].last().rps / sides[1].last().rps
		hh := sides[0].last().rps / sides[2].last().rps
		hostNginx, hostHAProxy = append(hostNginx, hn), append(hostHAProxy, hh)
		fmt.Fprintf(&out, "round %d (load average %s, steal %.1f%%)\n", round+1, load, steal)
		for _, s := range sides {
			r := s.last()
			fmt.Fprintf(&out, "  %-18s %9.0f req/s  p99 %8v  CPU %6.1fµs/req\n", s.name, r.rps, r.p99, micros(r.cpuPerReq))
		}
		fmt.Fprintf(&out, "  host/nginx %.2f  host/haproxy %.2f  (req/s)\n", hn, hh)
	}
	b.StopTimer()

	fmt.Fprintf(&out, "medians of %d rounds\n", rounds)
	for _, s := range sides {
		fmt.Fprintf(&out, "  %-18s %9.0f req/s  p99 %8v  CPU %6.1fµs/req\n", s.name, s.median(func(r wrkResult) float64 { return r.rps }),
			time.Duration(s.median(func(r wrkResult) float64 { return float64(r.p99) })),
			micros(time.Duration(s.median(func(r wrkResult) float64 { return float64(r.cpuPerReq) }))))
	}
	fmt.Fprintf(&out, "  host/nginx %.2f  host/haproxy %.2f  (req/s); host p99 / nginx p99 %.2f; steal %.1f%%\n",
		median(hostNginx), median(hostHAProxy),
		sides[0].median(func(r wrkResult) float64 { return float64(r.p99) })/sides[1].median(func(r wrkResult) float64 { return float64(r.p99) }),
		median(steals))
	fmt.Fprintf(&out, "target: host ≥ 1.0× nginx in req/s with p99 ≤ nginx's: %s\n",
		verdict(median(hostNginx) >= 1 && sides[0].median(func(r wrkResult) float64 { return float64(r.p99) }) <=
			sides[1].median(func(r wrkResult) float64 { return float64(r.p99) })))
	b.ReportMetric(median(hostNginx), "host/nginx-req/s")
	b.ReportMetric(median(hostHAProxy), "host/haproxy-req/s")
	b.ReportMetric(sides[0].median(func(r wrkResult) float64 { return r.rps }), "host-req/s")
	b.ReportMetric(sides[1].median(func(r wrkResult) float64 { return r.rps }), "nginx-req/s")
	fmt.Print(out.String())
}

// peerSide is one of the paths BenchmarkPeers loads.
type peerSide struct {
	name    string
	url     string
	pids    func() []int // the processes that serve it
	results []wrkResult
}

func (s *peerSide) last() wrkResult { return s.results[len(s.results)-1] }

func (s *peerSide) median(f func(wrkResult) float64) float64 {
	var v []float64
	for _, r := range s.results {
		v = append(v, f(r))
	}
	return median(v)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// wrkResult is what one wrk run reported.
type wrkResult struct {
	requests  int
	rps       float64
	p99       time.Duration
	cpuPerReq time.Duration
}

var (
	wrkRequestsRE = regexp.MustCompile(`(?m)^\s*(\d+) requests in`)
	wrkRPSRE      = regexp.MustCompile(`(?m)^Requests/sec:\s+([0-9.]+)`)
	wrkP99RE      = regexp.MustCompile(`(?m)^\s+99%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkBadRE      = regexp.MustCompile(`(?m)^\s*(Non-2xx or 3xx responses|Socket errors):.*$`)
)

// runWrk loads url with wrk for d and returns its figures. A run with
// failed requests fails b: its figures would not compare.
func runWrk(tb testing.TB, url string, threads, conns int, d time.Duration) wrkResult {
	tb.Helper()
	secs := max(1, int(d.Round(time.Second)/time.Second))
	cmd := exec.Command("wrk", "-t"+strconv.Itoa(threads), "-c"+strconv.Itoa(conns), "-d"+strconv.Itoa(secs)+"s", "--latency", url)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	outB, err := cmd.CombinedOutput()
	out := string(outB)
	if err != nil {
		tb.Fatalf("wrk %s: %v\n%s", url, err, out)
	}
	if m := wrkBadRE.FindString(out); m != "" {
		tb.Fatalf("wrk %s: %s\n%s", url, strings.TrimSpace(m), out)
	}
	var r wrkResult
	m1, m2, m3 := wrkRequestsRE.FindStringSubmatch(out), wrkRPSRE.FindStringSubmatch(out), wrkP99RE.FindStringSubmatch(out)
	if m1 == nil || m2 == nil || m3 == nil {
		tb.Fatalf("wrk %s: cannot read its report:\n%s", url, out)
	}
	r.requests, _ = strconv.Atoi(m1[1])
	r.rps, _ = strconv.ParseFloat(m2[1], 64)
	p, _ := strconv.ParseFloat(m3[1], 64)
	unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[m3[2]]
	r.p99 = time.Duration(p * float64(unit)).Round(10 * time.Microsecond)
	return r
}

// peer is a process BenchmarkPeers started.
type peer struct {
	pid  int
	addr string
}

// tree returns the peer's pid and its children's (nginx's workers).
func (p *peer) tree() []int {
	pids := []int{p.pid}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid(pid) == p.pid {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ppid returns pid's parent, or 0.
func ppid(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// pidsCPU returns the CPU time the processes have used.
func pidsCPU(tb testing.TB, pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		d += procCPU(tb, pid)
	}
	return d
}

// startPeer starts a process and kills it, by its pid, when tb ends; it
// dies with the test process too. For peerserver, the address it
// prints is its addr.
func startPeer(tb testing.TB, name, path string, args ...string) *peer {
	tb.Helper()
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", name, err)
	}
	p := &peer{pid: cmd.Process.Pid}
	tb.Cleanup(func() {
		// SIGTERM first: nginx's master stops its workers on it.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	if name == "peerserver" {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			tb.Fatalf("%s: read its address: %v", name, err)
		}
		p.addr = strings.TrimSpace(line)
	}
	return p
}

// startNginx runs nginx in the foreground, as many workers as CPUs,
// proxying to backend over kept-alive connections.
func startNginx(tb testing.TB, backend string) *peer {
	tb.Helper()
	dir := tb.TempDir()
	addr := freeAddr(tb)
	cfg := fmt.Sprintf(`daemon off;
worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream backend {
    server %[2]s;
    keepalive 128;
  }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
`, dir, backend, addr)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		tb.Fatal(err)
	}
	p := startPeer(tb, "nginx", "nginx", "-c", path, "-p", dir, "-e", filepath.Join(dir, "error.log"))
	p.addr = addr
	waitListening(tb, addr)
	return p
}

// startHAProxy runs HAProxy in the foreground, its default of a thread
// per CPU, proxying to backend and reusing its connections.
func startHAProxy(tb testing.TB, backend string) *peer {
	tb.Helper()
	dir := tb.TempDir()
	addr := freeAddr(tb)
	cfg := fmt.Sprintf(`global
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend front
  bind %s
  default_backend back
backend back
  server s1 %s
`, addr, backend)
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		tb.Fatal(err)
	}
	p := startPeer(tb, "haproxy", "haproxy", "-db", "-f", path)
	p.addr = addr
	waitListening(tb, addr)
	return p
}

// freeAddr returns a 127.0.0.1 address with a port free a moment ago.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// waitListening waits until addr takes connections.
func waitListening(tb testing.TB, addr string) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("nothing listens on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
