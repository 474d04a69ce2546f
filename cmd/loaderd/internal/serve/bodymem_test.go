// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// bodyShapes are refused request bodies of about size bytes, each a shape
// that makes a decoder materialise much more than it read.
func bodyShapes(size int) map[string][]byte {
	arr := func(key string, elem []byte, n int) []byte { // {key: [elem × n]}
		b := []byte{0x81, 0xa0 | byte(len(key))}
		b = append(b, key...)
		b = append(b, 0xdd)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		for range n {
			b = append(b, elem...)
		}
		return b
	}
	str := func(key string, n int) []byte { // {key: "xxx..."}
		b := []byte{0x81, 0xa0 | byte(len(key))}
		b = append(b, key...)
		b = append(b, 0xdb)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		return append(b, bytes.Repeat([]byte{'x'}, n)...)
	}
	keys := func(key string, n int) []byte { // {key: {"k0": nil, "k1": nil, ...}}
		b := []byte{0x81, 0xa0 | byte(len(key))}
		b = append(b, key...)
		b = append(b, 0xdf)
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		for i := range n {
			k := []byte{byte('a' + i%26), byte('a' + i/26%26), byte('a' + i/676%26), byte('a' + i/17576%26)}
			b = append(b, 0xa4)
			b = append(b, k...)
			b = append(b, 0xc0)
		}
		return b
	}
	deep := func(key string, n int) []byte { // {key: [[[...], ...] × n]}: nested 15 deep, many times over
		b := []byte{0x81, 0xa0 | byte(len(key))}
		b = append(b, key...)
		one := bytes.Repeat([]byte{0x91}, 14)
		one = append(one, 0x80)
		b = append(b, 0xdd)
		b = binary.BigEndian.AppendUint32(b, uint32(n/len(one)))
		for range n / len(one) {
			b = append(b, one...)
		}
		return b
	}
	return map[string][]byte{
		"long string":    str("dataset", size),
		"ints in a list": arr("release", []byte{0x01}, size),
		"options list":   arr("backend_options", []byte{0x01}, size),
		"nils in a list": arr("keep", []byte{0xc0}, size),
		"many keys":      keys("backend_options", size/6),
		"deep maps":      deep("backend_options", size),
		"unknown key":    str("no_such_key", size),
	}
}

// unsized hides a body's length: the request goes as if chunked.
type unsized struct{ io.Reader }

// refusedBodyEndpoints are the endpoints that take a body, with their
// limits.
var refusedBodyEndpoints = []struct {
	path  string
	limit int
}{
	{"/v1/sessions", wire.MaxOpenBody},
	{"/v1/sessions/x/next", wire.MaxSmallBody},
	{"/v1/sessions/x/release", wire.MaxSmallBody},
	{"/v1/sessions/x/stream", wire.MaxSmallBody},
}

// allocated returns the bytes h allocated answering req, and its status.
func allocated(h http.Handler, req *http.Request) (uint64, int) {
	rec := httptest.NewRecorder()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h.ServeHTTP(rec, req)
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, rec.Code
}

// TestRefusedBodyCostsItsSize: a refused body of 1 MiB, of every shape,
// on every endpoint that takes one, sized or not, costs the daemon at most
// 3 times its size in allocations (reading it included), and so does a
// body just under the endpoint's limit, with 16 KiB for the request
// itself; before, decoding into generic values and typed slices cost
// 12–27 times.
func TestRefusedBodyCostsItsSize(t *testing.T) {
	h := New(Config{}).Handler()
	const slack = 16 << 10
	for _, ep := range refusedBodyEndpoints {
		for _, size := range []int{1 << 20, ep.limit - 64} {
			for name, body := range bodyShapes(size) {
				for _, sized := range []bool{true, false} {
					var rd io.Reader = bytes.NewReader(body)
					if !sized {
						rd = unsized{rd}
					}
					req := httptest.NewRequest("POST", ep.path, rd)
					req.Header.Set("Upgrade", wire.StreamUpgrade)
					alloc, code := allocated(h, req)
					what := fmt.Sprintf("POST %s, %s of %d bytes (sized %v)", ep.path, name, len(body), sized)
					t.Logf("%s: %d, %d bytes allocated (%.2f×)", what, code, alloc, float64(alloc)/float64(len(body)))
					if code != http.StatusBadRequest {
						t.Errorf("%s: answered %d, want 400", what, code)
					}
					if alloc > 3*uint64(len(body))+slack {
						t.Errorf("%s: %d bytes allocated (%.1f×; at most 3× and %d)", what, alloc, float64(alloc)/float64(len(body)), slack)
					}
				}
			}
		}
	}
}

// TestRefusedBodiesConcurrently: 64 connections of nobody's and 64 of a
// throwaway uid's each send refused 1 MiB bodies of every shape, on every
// endpoint, to a live daemon, over and over; the daemon's heap in use
// grows by at most 64 MiB meanwhile (before: by gigabytes).
func TestRefusedBodiesConcurrently(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "clients as other uids need root (euid %d)", os.Geteuid())
	}
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "c"), 0o755)
	os.WriteFile(filepath.Join(root, "c", "a.jpg"), []byte("sample"), 0o644)
	sock := daemon(t, testfs.MapDir(t, root))
	type shaped struct {
		path string
		body []byte
	}
	var bodies []shaped
	for _, ep := range refusedBodyEndpoints {
		for _, size := range []int{1 << 20, ep.limit - 64} {
			for _, b := range bodyShapes(size) {
				bodies = append(bodies, shaped{ep.path, b})
			}
		}
	}
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	var refused, other atomic.Int64
	for i := range 128 {
		uid := uint32(nobodyID)
		if i%2 == 1 {
			uid = 43117
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := testenv.DialUnixAs(sock, uid, uid, nil)
			if err != nil {
				t.Errorf("uid %d: %v", uid, err)
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			for j := range 6 {
				b := bodies[(i+j*7)%len(bodies)]
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: d\r\nUpgrade: %s\r\nContent-Length: %d\r\n\r\n", b.path, wire.StreamUpgrade, len(b.body))
				c.SetDeadline(time.Now().Add(20 * time.Second))
				go c.Write(b.body) // the daemon may answer before it reads it all
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					return // closed after a body too large: dial again
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusBadRequest {
					refused.Add(1)
				} else {
					other.Add(1)
					t.Errorf("POST %s: %d, want 400", b.path, resp.StatusCode)
				}
				if resp.Close {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	grew := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("%d refused, %d otherwise; heap in use %.1f MiB before, %.1f MiB at most during (+%.1f MiB)", refused.Load(), other.Load(),
		float64(base.HeapInuse)/(1<<20), float64(peak.Load())/(1<<20), float64(grew)/(1<<20))
	if refused.Load() < 128 {
		t.Errorf("only %d requests answered 400", refused.Load())
	}
	if grew > 64<<20 {
		t.Errorf("the heap in use grew by %.1f MiB (at most 64 MiB)", float64(grew)/(1<<20))
	}
}
