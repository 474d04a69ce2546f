// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

type fixture struct {
	m      *bmap.Map
	sock   string
	client *http.Client
	done   chan error
	cancel context.CancelFunc
}

func start(t *testing.T, timeout time.Duration) *fixture {
	return startWith(t, Config{SessionTimeout: timeout})
}

// startWith is start with cfg (its Datasets set to the fixture's).
func startWith(t *testing.T, cfg Config) *fixture {
	root := t.TempDir()
	for i := 0; i < 97; i++ {
		p := filepath.Join(root, fmt.Sprintf("c%d", i%5), fmt.Sprintf("%03d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, bytes.Repeat([]byte{byte(i), byte(i >> 3)}, 500+i*61), 0o644)
	}
	f := &fixture{m: testfs.MapDir(t, root), sock: filepath.Join(t.TempDir(), "d.sock"), done: make(chan error, 1)}
	cfg.Datasets = map[string]*bmap.Map{"ds": f.m}
	srv := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go func() { f.done <- srv.Run(ctx, Listen{Socket: f.sock}) }()
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(f.sock); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", f.sock)
	}}}
	t.Cleanup(func() { f.stop(t) })
	return f
}

func (f *fixture) stop(t *testing.T) {
	if f.cancel == nil {
		return
	}
	f.cancel()
	f.cancel = nil
	if err := <-f.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, err := os.Stat(f.sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind: %v", err)
	}
	if n := batchMemfds(t); n != 0 {
		t.Errorf("%d batch memories left open after Run", n)
	}
}

// batchMemfds counts this process's open batch memories (memfds; the
// daemon runs in the test's process).
func batchMemfds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "/memfd:nvfeed-batches") {
			n++
		}
	}
	return n
}

// memory asks for session id's batch memory as the client does: an
// upgraded connection, one frame carrying the descriptor (SCM_RIGHTS).
// It maps the memory read-only and returns it with its description.
func (f *fixture) memory(t *testing.T, id string) ([]byte, wire.MemoryResponse) {
	t.Helper()
	mr, fd, err := receiveMemory(f.sock, id)
	if err != nil {
		t.Fatalf("session %s: memory: %v", id, err)
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, 0, int(mr.Memory.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("session %s: map %d bytes: %v", id, mr.Memory.Size, err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem, mr
}

// receiveMemory does the memory upgrade on a new connection to sock and
// returns the frame and the descriptor passed with it.
func receiveMemory(sock, id string) (wire.MemoryResponse, int, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return wire.MemoryResponse{}, -1, err
	}
	return receiveMemoryOn(c, id)
}

// receiveMemoryOn is receiveMemory on the connection c, which it closes.
func receiveMemoryOn(c net.Conn, id string) (wire.MemoryResponse, int, error) {
	var mr wire.MemoryResponse
	defer c.Close()
	uc := c.(*net.UnixConn)
	fmt.Fprintf(uc, "POST /v1/sessions/%s/memory HTTP/1.1\r\nHost: d\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: 0\r\n\r\n", id, wire.MemoryUpgrade)
	var data []byte
	fd := -1
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			if perr != nil {
				return mr, -1, perr
			}
			for _, m := range msgs {
				fds, perr := unix.ParseUnixRights(&m)
				if perr != nil {
					return mr, -1, perr
				}
				for _, x := range fds {
					if fd < 0 {
						fd = x
					} else {
						unix.Close(x)
					}
				}
			}
		}
		data = append(data, buf[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	head, body, ok := bytes.Cut(data, []byte("\r\n\r\n"))
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 101")) || !ok {
		if fd >= 0 {
			unix.Close(fd)
		}
		return mr, -1, fmt.Errorf("%q", data)
	}
	if len(body) < 4 || fd < 0 {
		return mr, -1, fmt.Errorf("no frame or no descriptor: %q", body)
	}
	if err := msgpack.Unmarshal(body[4:], &mr); err != nil {
		unix.Close(fd)
		return mr, -1, err
	}
	return mr, fd, nil
}

// call makes a request; out receives the body of a 200, or of a refusal
// (its error message).
func (f *fixture) call(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	code, raw := (&client{http: f.client, base: "http://d"}).call(t, method, path, body, out)
	if out != nil && code != http.StatusOK && len(raw) > 0 { // a refusal's message, for the tests that read it
		if err := msgpack.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %d: %v", method, path, code, err)
		}
	}
	return code
}

func TestEightRanksAtOnce(t *testing.T) {
	f := start(t, time.Minute)
	var wg sync.WaitGroup
	seen := make([][]int32, 8)
	for k := 0; k < 8; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var open wire.OpenResponse
			if code := f.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, ShardID: k, NumShards: 8, RandomShuffle: true, Seed: 1}, Backend: "file"}}, &open); code != 200 {
				t.Errorf("rank %d: open: %d", k, code)
				return
			}
			mr, fd, err := receiveMemory(f.sock, open.ID)
			if err != nil {
				t.Errorf("rank %d: memory: %v", k, err)
				return
			}
			mem, err := unix.Mmap(fd, 0, int(mr.Memory.Size), unix.PROT_READ, unix.MAP_SHARED)
			unix.Close(fd)
			if err != nil {
				t.Error(err)
				return
			}
			defer unix.Munmap(mem)
			for {
				var nb wire.NextResponse
				if code := f.call(t, "POST", "/v1/sessions/"+open.ID+"/next", nil, &nb); code != 200 {
					t.Errorf("rank %d: next: %d", k, code)
					return
				}
				if nb.EndOfEpoch {
					break
				}
				for i, idx := range nb.Indices {
					s := &f.m.Samples[idx]
					want, _ := os.ReadFile(filepath.Join(f.m.Root, s.Path))
					if got := mem[nb.Offsets[i] : nb.Offsets[i]+nb.Lengths[i]]; !bytes.Equal(got, want) || nb.Labels[i] != s.Label {
						t.Errorf("rank %d: sample %d differs from its file", k, idx)
					}
					seen[k] = append(seen[k], idx)
				}
				f.call(t, "POST", "/v1/sessions/"+open.ID+"/release", wire.ReleaseRequest{Slot: nb.Slot}, nil)
			}
			f.call(t, "DELETE", "/v1/sessions/"+open.ID, nil, nil)
		}()
	}
	wg.Wait()
	count := map[int32]int{}
	for _, s := range seen {
		for _, i := range s {
			count[i]++
		}
	}
	if len(count) != len(f.m.Samples) {
		t.Errorf("ranks covered %d of %d samples", len(count), len(f.m.Samples))
	}
	for i, c := range count {
		if c != 1 {
			t.Errorf("sample %d read by %d ranks", i, c)
		}
	}
}

func TestValidationAndReaping(t *testing.T) {
	f := start(t, 300*time.Millisecond)
	for _, tt := range []struct {
		req  wire.OpenRequest
		code int
	}{
		{wire.OpenRequest{Dataset: "nope", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}}, 404},
		{wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 0, NumShards: 1}}}, 400},
		{wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1 << 30, NumShards: 1}}}, 400},
		{wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, ShardID: 3, NumShards: 3}}}, 400},
		{wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}, Backend: "disk"}}, 400},
		{wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}, Memory: "hbm"}}, 400},
		{wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}, PrefetchQueueDepth: new(1000)}}, 400},
	} {
		var e wire.ErrorResponse
		if code := f.call(t, "POST", "/v1/sessions", tt.req, &e); code != tt.code || e.Error == "" {
			t.Errorf("%+v: %d %q, want %d with a message", tt.req, code, e.Error, tt.code)
		}
	}
	// Holding every slot is refused, not a hang.
	var open wire.OpenResponse
	f.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}, PrefetchQueueDepth: new(1), ReleaseAfter: new(0)}}, &open)
	codes := []int{}
	for i := 0; i < 3; i++ {
		var nb wire.NextResponse
		codes = append(codes, f.call(t, "POST", "/v1/sessions/"+open.ID+"/next", nil, &nb))
	}
	if codes[0] != 200 || codes[2] != 409 {
		t.Errorf("next with every slot held: %v, want 200 ... 409", codes)
	}
	// Left idle, it is reaped and its memory freed. The memory's going is
	// the reaping's progress: asking for its state would keep it alive.
	testenv.Eventually(t, "the idle session's memory freed", func() bool { return batchMemfds(t) == 0 })
	testenv.Eventually(t, "the idle session gone", func() bool {
		return f.call(t, "GET", "/v1/sessions/"+open.ID+"/state", nil, nil) == 404
	})
	if code := f.call(t, "GET", "/healthz", nil, nil); code != 200 {
		t.Errorf("healthz: %d", code)
	}
}

func TestShutdownEndsSessions(t *testing.T) {
	f := start(t, time.Minute)
	var open wire.OpenResponse
	f.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 8, NumShards: 1}}}, &open)
	if n := batchMemfds(t); n != 1 {
		t.Fatalf("%d batch memories open with one session, want 1", n)
	}
	f.stop(t) // checks: Run returned nil, socket removed, memory closed
}
