// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader"
)

// nobody is the uid the attacking clients run as.
const nobody = 65534

// python is the interpreter the other uids' clients run (a system one:
// nobody can read it).
const python = "/usr/bin/python3"

// asUser starts script in python as uid (gid the same) with args; its
// stdin is returned for the test to drive it and its stdout as lines.
func asUser(t *testing.T, uid int, script string, extra []*os.File, args ...string) (io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "running clients as other users needs root (euid %d)", os.Geteuid())
	}
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no %s: %v", python, err)
	}
	cmd := exec.Command(python, append([]string{"-I", "-c", script}, args...)...)
	cmd.Dir, cmd.Env, cmd.ExtraFiles, cmd.Stderr = "/", []string{"PATH=/usr/bin:/bin"}, extra, os.Stderr
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	return in, bufio.NewScanner(out)
}

// publicDir makes a directory every user may search, removed after t.
func publicDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "loaderd-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// publicDataset makes f's dataset readable by every user (its directories
// are t.TempDir's, 0700).
func publicDataset(t *testing.T, m *bmap.Map) {
	for d := m.Root; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// serveWith runs a daemon over m with cfg and l until t ends.
func serveWith(t *testing.T, m *bmap.Map, cfg Config, l Listen) {
	t.Helper()
	cfg.Datasets = map[string]*bmap.Map{"ds": m}
	srv := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(l.Socket); err == nil {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("Run: %v", err)
		default:
		}
	}
	t.Fatal("the socket never appeared")
}

// client talks to the daemon over the unix socket sock, or over TCP at
// addr with token.
type client struct {
	http  *http.Client
	base  string
	token string
}

func unixClient(sock string) *client {
	return &client{base: "http://d", http: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}}
}

// call makes a request and returns its status and raw body.
func (c *client) call(t *testing.T, method, path string, body, out any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := msgpack.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.base+path, rd)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode == 200 {
		if err := msgpack.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return resp.StatusCode, raw
}

// flooder opens N connections to the socket and holds them, then prints
// "ready N" and what the last one was answered, if anything.
const flooder = `
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks = []
for i in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    socks.append(s)
socks[-1].settimeout(2)
try:
    answer = socks[-1].recv(4096)
except OSError as e:
    answer = repr(e).encode()
print("ready", len(socks), answer.decode(errors="replace").replace("\r\n", " | "), flush=True)
sys.stdin.read()
`

// opener waits for a line on stdin, then opens a session and prints the
// status line and the seconds it took.
const opener = `
import socket, sys, time
sys.stdin.readline()
t = time.time()
body = bytes.fromhex("83a764617461736574a26473aa62617463685f73697a6501aa6e756d5f73686172647301")  # {"dataset": "ds", "batch_size": 1, "num_shards": 1}
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(float(sys.argv[2]))
    s.connect(sys.argv[1])
    s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    line = s.recv(64).split(b"\r\n")[0].decode()
except OSError as e:
    line = "error " + repr(e)
print(line, "after", round(time.time() - t, 3), flush=True)
`

// TestConnectionFloodStopsNoOtherUser: nobody opens 2000 idle connections
// (the daemon's file descriptors are limited as a service's would be);
// another uid still opens a session within a second, and nobody's
// connections past the limit per uid are answered 429 naming it.
func TestConnectionFloodStopsNoOtherUser(t *testing.T) {
	const flood = 2000
	m := start(t, time.Minute).m
	sock := filepath.Join(publicDir(t), "d.sock")
	serveWith(t, m, Config{SessionTimeout: time.Minute}, Listen{Socket: sock, Mode: 0o666})
	attacker, attackerOut := asUser(t, nobody, flooder, nil, sock, fmt.Sprint(flood))
	victim, victimOut := asUser(t, 0, opener, nil, sock, "1")
	// The daemon may have a few hundred descriptors more than it uses now.
	lowerFDLimit(t, 256)
	defer attacker.Close()
	if !attackerOut.Scan() {
		t.Fatal("the flooding client died")
	}
	ready := attackerOut.Text()
	t.Logf("flooder: %.200s", ready)
	io.WriteString(victim, "go\n")
	if !victimOut.Scan() {
		t.Fatal("the opening client died")
	}
	if got := victimOut.Text(); !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Errorf("uid 0's open while uid %d holds %d connections: %q, want 200 within a second", nobody, flood, got)
	}
	if want := "429 Too Many Requests"; !strings.Contains(ready, want) || !strings.Contains(ready, fmt.Sprintf("uid %d, %d open", nobody, DefaultMaxConnsPerUID)) {
		t.Errorf("connection %d of uid %d was answered %q, want %s naming the limit", flood, nobody, ready, want)
	}
}

// lowerFDLimit lowers the process's fd limit to headroom past the
// descriptors open now, as a service's would be, until t ends.
func lowerFDLimit(t *testing.T, headroom int) {
	t.Helper()
	fds, _ := os.ReadDir("/proc/self/fd")
	var old unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &old)
	lim := old
	lim.Cur = uint64(len(fds) + headroom)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
}

// readUntilClosed reads c until the daemon closes it and returns how long
// that took, or fails after limit.
func readUntilClosed(t *testing.T, c net.Conn, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(limit))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection is still open after %s", limit)
	}
	return time.Since(start)
}

// TestConnectionTimeouts: a slow request (headers or body) and an idle
// keep-alive are closed after their limit, while a batch stream (a
// connection taken over) outlives those limits as long as frames pass,
// and is closed after its own idle limit.
func TestConnectionTimeouts(t *testing.T) {
	const limit = 300 * time.Millisecond
	f := start(t, time.Minute)
	sock := filepath.Join(t.TempDir(), "t.sock")
	serveWith(t, f.m, Config{SessionTimeout: time.Second}, Listen{Socket: sock, ReadTimeout: limit, IdleTimeout: limit,
		WriteTimeout: 5 * time.Second, StreamIdleTimeout: time.Second})
	tests := []struct {
		name, send string
	}{
		{"slow headers", "GET /healthz HTTP/1.1\r\nHost: d\r\n"},
		{"slow body", "POST /v1/sessions HTTP/1.1\r\nHost: d\r\nContent-Length: 100\r\n\r\n\x82"},
		{"idle keep-alive", "GET /healthz HTTP/1.1\r\nHost: d\r\n\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, tt.send)
			if took := readUntilClosed(t, c, 3*time.Second); took < limit/2 {
				t.Errorf("closed after %s, before the limit of %s", took, limit)
			}
		})
	}
	t.Run("stream", func(t *testing.T) {
		g := &fixture{m: f.m, sock: sock, client: unixClient(sock).http}
		open := g.openThreeSlots(t)
		s := g.openStream(t, open.ID, nil)
		var held []int
		for range 3 {
			r, ok := s.recv(5 * time.Second)
			if !ok {
				t.Fatal("no batch")
			}
			held = append(held, r.Slot)
		}
		// Quiet for longer than the read and idle timeouts, then on.
		for i := range 2 {
			time.Sleep(2 * limit)
			s.send(wire.StreamControl{Release: []int{held[i]}})
			if _, ok := s.recv(5 * time.Second); !ok {
				t.Fatalf("after %s quiet: no batch for a release", 2*limit)
			}
		}
		// Quiet past the stream's idle limit: the daemon says why and closes.
		// The wait is generous: under -race with every package's tests
		// on two cores, the daemon's 1 s idle timer may fire late.
		start := time.Now()
		s.conn.SetReadDeadline(start.Add(15 * time.Second))
		rest, err := io.ReadAll(s.rd)
		if !bytes.Contains(rest, []byte("without a frame either way")) {
			t.Errorf("an idle stream ended after %s with %q (read: %v), want an error frame saying it was idle",
				time.Since(start), rest, err)
		}
	})
}

// TestTCPSessionsHaveOwner: a session opened over TCP belongs to the TCP
// principal: no unix-socket caller may use or close it, and a TCP caller
// may not touch a unix caller's session; /metrics names no session.
func TestTCPSessionsHaveOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "the TCP principal is nobody: a unix caller of another uid needs root (euid %d)", os.Geteuid())
	}
	f := start(t, time.Minute)
	publicDataset(t, f.m) // TCP callers are judged as nobody
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	sock := filepath.Join(t.TempDir(), "o.sock")
	serveWith(t, f.m, Config{SessionTimeout: time.Minute}, Listen{Socket: sock, TCP: addr, Token: "sesame"})
	viaUnix := unixClient(sock)
	viaTCP := &client{http: &http.Client{}, base: "http://" + addr, token: "sesame"}
	req := wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}}}
	var tcpOpen, unixOpen wire.OpenResponse
	if code, raw := viaTCP.call(t, "POST", "/v1/sessions", req, &tcpOpen); code != 200 {
		t.Fatalf("open over TCP: %d %s", code, raw)
	}
	if code, raw := viaUnix.call(t, "POST", "/v1/sessions", req, &unixOpen); code != 200 {
		t.Fatalf("open over the socket: %d %s", code, raw)
	}
	tests := []struct {
		name         string
		c            *client
		method, path string
		want         int
	}{
		{"unix reads a TCP session's state", viaUnix, "GET", "/v1/sessions/" + tcpOpen.ID + "/state", 403},
		{"unix takes a TCP session's batch", viaUnix, "POST", "/v1/sessions/" + tcpOpen.ID + "/next", 403},
		{"unix closes a TCP session", viaUnix, "DELETE", "/v1/sessions/" + tcpOpen.ID, 403},
		{"TCP reads a unix session's state", viaTCP, "GET", "/v1/sessions/" + unixOpen.ID + "/state", 403},
		{"TCP closes a unix session", viaTCP, "DELETE", "/v1/sessions/" + unixOpen.ID, 403},
		{"TCP reads its session's state", viaTCP, "GET", "/v1/sessions/" + tcpOpen.ID + "/state", 200},
		{"unix reads its session's state", viaUnix, "GET", "/v1/sessions/" + unixOpen.ID + "/state", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if code, raw := tt.c.call(t, tt.method, tt.path, nil, nil); code != tt.want {
				t.Errorf("%s %s: %d %s, want %d", tt.method, tt.path, code, raw, tt.want)
			}
		})
	}
	code, metrics := viaUnix.call(t, "GET", "/metrics", nil, nil)
	if code != 200 {
		t.Fatalf("/metrics: %d\n%s", code, metrics)
	}
	if !bytes.Contains(metrics, []byte("nvfeed_sessions 2")) || !bytes.Contains(metrics, []byte(`nvfeed_batches_total{backend="file",dataset="ds"}`)) {
		t.Errorf("/metrics lacks the sessions or the per dataset and backend series:\n%s", metrics)
	}
	for _, id := range []string{tcpOpen.ID, unixOpen.ID} {
		if bytes.Contains(metrics, []byte(id)) {
			t.Errorf("/metrics names session %s: whoever reads it may drive the session", id)
		}
	}
}

// probe tries, as another uid, what a client could do to make its batch
// memory (fd 3, as received) writable, and prints one line per attempt:
// its name and "ok" or the error.
const probe = `
import mmap, os
def attempt(name, fn):
    try:
        fn()
        print(name, "ok", flush=True)
    except OSError as e:
        print(name, e.strerror, flush=True)
attempt("reopen-rdwr", lambda: os.close(os.open("/proc/self/fd/3", os.O_RDWR)))
attempt("reopen-wronly", lambda: os.close(os.open("/proc/self/fd/3", os.O_WRONLY)))
attempt("write", lambda: os.pwrite(3, b"x", 0))
attempt("ftruncate", lambda: os.ftruncate(3, 0))
attempt("mmap-write", lambda: mmap.mmap(3, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE).close())
attempt("read", lambda: os.pread(3, 16, 0))
attempt("mmap-read", lambda: mmap.mmap(3, 4096, mmap.MAP_SHARED, mmap.PROT_READ).close())
`

// TestBatchMemoryNotWritableByClient: the descriptor a client receives
// cannot be made writable: reopened through /proc, written, resized or
// mapped writable by a client of another uid; it can be read and mapped.
func TestBatchMemoryNotWritableByClient(t *testing.T) {
	f := start(t, time.Minute)
	open := f.openThreeSlots(t)
	_, fd, err := receiveMemory(f.sock, open.ID)
	if err != nil {
		t.Fatal(err)
	}
	mem := os.NewFile(uintptr(fd), "batch memory")
	defer mem.Close()
	_, out := asUser(t, nobody, probe, []*os.File{mem})
	got := map[string]string{}
	for out.Scan() {
		name, result, _ := strings.Cut(out.Text(), " ")
		got[name] = result
	}
	for _, tt := range []struct {
		attempt string
		ok      bool
	}{
		{"reopen-rdwr", false}, {"reopen-wronly", false}, {"write", false}, {"ftruncate", false}, {"mmap-write", false},
		{"read", true}, {"mmap-read", true},
	} {
		switch r, seen := got[tt.attempt]; {
		case !seen:
			t.Errorf("%s: not tried (the probe died?)", tt.attempt)
		case tt.ok && r != "ok":
			t.Errorf("%s as uid %d: %s, want it to work", tt.attempt, nobody, r)
		case !tt.ok && r == "ok":
			t.Errorf("%s as uid %d succeeded: the client can write its batch memory", tt.attempt, nobody)
		}
	}
}
