// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// chaosRequests is how many mutated requests TestMutatedRequests sends by
// default (NVFEED_CHAOS_REQUESTS overrides it; NVFEED_CHAOS_SEED the seed).
const chaosRequests = 5000

// envInt returns the environment's integer name, or def.
func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// extremes are what a mutation puts in place of a value.
var extremes = []any{0, -1, 1, 2, 3, 1 << 31, 1<<31 - 1, -1 << 31, int64(math.MaxInt64), int64(math.MinInt64), uint64(math.MaxUint64),
	1.5, math.NaN(), math.Inf(1), "", "x", strings.Repeat("s", 1<<16), true, nil, []any{}, []any{1, 2, 3}, make([]any, 5000),
	map[string]any{}, map[string]any{"epoch": -1}, []byte{0xff}}

// chaos generates mutated requests from a seeded source.
type chaos struct {
	rng *rand.Rand
}

func (c *chaos) pick(n int) int { return c.rng.IntN(n) }

// mutateValue replaces, adds or removes values in v (maps nest), some
// levels deep.
func (c *chaos) mutateValue(v any, depth int) any {
	m, ok := v.(map[string]any)
	if !ok || depth > 3 || c.pick(4) == 0 {
		return extremes[c.pick(len(extremes))]
	}
	out := map[string]any{}
	keys := make([]string, 0, len(m))
	for k, x := range m {
		out[k] = x
		keys = append(keys, k)
	}
	switch c.pick(6) {
	case 0:
		out[[]string{"epoch", "iteration", "slot", "release", "keep", "stop", "nope", "state", "seed"}[c.pick(9)]] = extremes[c.pick(len(extremes))]
	case 1:
		if len(keys) > 0 {
			delete(out, keys[c.pick(len(keys))])
		}
	default:
		if len(keys) > 0 {
			k := keys[c.pick(len(keys))]
			out[k] = c.mutateValue(out[k], depth+1)
		}
	}
	return out
}

// mutate returns a mutation of the msgpack body b.
func (c *chaos) mutate(b []byte) []byte {
	switch c.pick(8) {
	case 0: // flip bytes
		b = bytes.Clone(b)
		for i := c.pick(4); i >= 0 && len(b) > 0; i-- {
			b[c.pick(len(b))] ^= byte(1 + c.pick(255))
		}
		return b
	case 1: // truncate
		return b[:c.pick(len(b)+1)]
	case 2: // a huge container or string header somewhere
		at := c.pick(len(b) + 1)
		hdr := [][]byte{{0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdf, 0xff, 0xff, 0xff, 0xff}, {0xdb, 0xff, 0xff, 0xff, 0xff}, {0xc6, 0x7f, 0xff, 0xff, 0xff}, {0xdc, 0xff, 0xff}}[c.pick(5)]
		return append(append(append([]byte{}, b[:at]...), hdr...), b[at:]...)
	case 3: // garbage
		g := make([]byte, c.pick(64))
		for i := range g {
			g[i] = byte(c.rng.Uint32())
		}
		return g
	case 4: // deep nesting
		return append(bytes.Repeat([]byte{0x91}, 1+c.pick(5000)), 0xc0)
	}
	var v map[string]any
	if err := msgpack.Unmarshal(b, &v); err != nil || v == nil {
		return b
	}
	out, err := msgpack.Marshal(c.mutateValue(v, 0))
	if err != nil {
		return b
	}
	return out
}

// TestMutatedRequests drives a live daemon (the real server on a unix
// socket, a real dataset) with thousands of seeded mutated requests over
// HTTP and the stream endpoint, on a real open session and on random ids:
// no response may be a 5xx or missing, and the daemon answers /healthz
// after every chunk. Every route of the router has its case (enumerated
// from the router: a new endpoint without one fails the test).
func TestMutatedRequests(t *testing.T) {
	n := envInt(t, "NVFEED_CHAOS_REQUESTS", chaosRequests)
	seed := uint64(envInt(t, "NVFEED_CHAOS_SEED", 1))
	if testing.Short() {
		n = min(n, 300)
	}
	f := start(t, time.Minute)
	streamCodes := map[int]int{} // stream answers by status
	f.client.Timeout = 10 * time.Second
	c := &chaos{rng: rand.New(rand.NewPCG(seed, 2))}
	ra := 1
	opens := []wire.OpenRequest{
		{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 3, ShardID: 1, RandomShuffle: true, Seed: 9}}},
		{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 3, NumShards: 1}, PrefetchQueueDepth: new(1), ReleaseAfter: &ra}},
		{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 3, PadLastBatch: true, StickToShard: true}, Backend: "file"}},
	}
	var live wire.OpenResponse
	reopen := func() {
		t.Helper()
		live = wire.OpenResponse{}
		if code := f.call(t, "POST", "/v1/sessions", opens[0], &live); code != 200 {
			t.Fatalf("open the live session: %d", code)
		}
	}
	reopen()
	openState := live.State
	bodies := map[string][][]byte{}
	add := func(kind string, vs ...any) {
		for _, v := range vs {
			b, err := msgpack.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			bodies[kind] = append(bodies[kind], b)
		}
	}
	for _, o := range opens {
		add("open", o)
		o.State = &openState
		add("open", o)
	}
	add("next", wire.NextRequest{}, wire.NextRequest{Release: []int{0}}, wire.NextRequest{Epoch: ptr(1), Iteration: ptr(2)}, wire.NextRequest{Epoch: ptr(0), Iteration: ptr(100)})
	add("release", wire.ReleaseRequest{Slot: 0}, wire.ReleaseRequest{Slot: 3})
	add("stream", wire.StreamRequest{}, wire.StreamRequest{Epoch: ptr(2), Iteration: ptr(1), Keep: []int{}}, wire.StreamRequest{Keep: []int{0, 1}})
	add("control", wire.StreamControl{Release: []int{0, 1}}, wire.StreamControl{Stop: true}, wire.StreamControl{Stop: true, Keep: []int{2}})

	var failures []string
	codes := map[int]int{} // status: how many, for the log
	failed := func(format string, args ...any) {
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	id := func() string {
		switch c.pick(5) {
		case 0:
			return hex.EncodeToString([]byte(fmt.Sprint(c.rng.Uint64())))[:24]
		case 1:
			return []string{"", "..", "%2e%2e", "x%00y", strings.Repeat("a", 4000), "-1"}[c.pick(6)]
		}
		return live.ID
	}
	body := func(kind string) []byte {
		bs := bodies[kind]
		b := bs[c.pick(len(bs))]
		if c.pick(6) == 0 {
			return b // valid ones too: the session must move
		}
		return c.mutate(b)
	}
	// One case per route of the router ("METHOD pattern"; "*" for every
	// method): each makes a request with its valid bodies, mutated or not.
	// A route the router has and this table lacks fails the test: a new
	// endpoint comes with its fuzzing.
	type chaosCase struct {
		weight int
		make   func(sid string) (method, path string, b []byte)
	}
	anyMethod := func() string {
		return []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"}[c.pick(7)]
	}
	const streamRoute, memoryRoute = "POST /v1/sessions/{id}/stream", "POST /v1/sessions/{id}/memory"
	cases := map[string]chaosCase{
		"GET /healthz":      {1, func(string) (string, string, []byte) { return "GET", "/healthz", c.mutate(bodies["next"][0]) }},
		"* /metrics":        {1, func(string) (string, string, []byte) { return anyMethod(), "/metrics", c.mutate(bodies["next"][0]) }},
		"GET /v1/backends":  {1, func(string) (string, string, []byte) { return "GET", "/v1/backends", c.mutate(bodies["next"][0]) }},
		"GET /v1/datasets":  {1, func(string) (string, string, []byte) { return "GET", "/v1/datasets", c.mutate(bodies["next"][0]) }},
		"GET /v1/status":    {1, func(string) (string, string, []byte) { return "GET", "/v1/status", c.mutate(bodies["next"][0]) }},
		"POST /v1/reload":   {1, func(string) (string, string, []byte) { return "POST", "/v1/reload", body("next") }},
		"POST /v1/sessions": {3, func(string) (string, string, []byte) { return "POST", "/v1/sessions", body("open") }},
		"POST /v1/sessions/{id}/next": {6, func(sid string) (string, string, []byte) {
			if c.pick(5) == 0 {
				return "POST", "/v1/sessions/" + sid + "/next", nil
			}
			return "POST", "/v1/sessions/" + sid + "/next", body("next")
		}},
		"POST /v1/sessions/{id}/release": {2, func(sid string) (string, string, []byte) {
			return "POST", "/v1/sessions/" + sid + "/release", body("release")
		}},
		"GET /v1/sessions/{id}/state": {1, func(sid string) (string, string, []byte) { return "GET", "/v1/sessions/" + sid + "/state", nil }},
		"DELETE /v1/sessions/{id}": {1, func(sid string) (string, string, []byte) {
			if sid == live.ID && c.pick(4) != 0 {
				sid = "x" // keep the live session most of the time
			}
			return "DELETE", "/v1/sessions/" + sid, nil
		}},
		memoryRoute: {2, nil}, // below: with and without the upgrade
		streamRoute: {3, nil}, // chaosStream
		// Not a route: methods and paths the router has no handler for.
		"": {3, func(sid string) (string, string, []byte) {
			path := []string{"/", "/v1", "/v1/sessions/" + sid, "/v1/sessions/" + sid + "/next/x", "/v2/x", "/v1/datasets/x", "/metrics/x"}[c.pick(7)]
			return anyMethod(), path, c.mutate(bodies["next"][0])
		}},
	}
	if err := chi.Walk(New(Config{MaxLockedBytes: 1 << 30}).Handler().(chi.Routes), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		if _, ok := cases[method+" "+route]; !ok {
			if _, ok := cases["* "+route]; !ok {
				return fmt.Errorf("route %s %s has no case in TestMutatedRequests", method, route)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k, cc := range cases {
		for range cc.weight {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // the seed alone decides the sequence
	for i := 0; i < n; i++ {
		sid := id()
		var method, path string
		var b []byte
		switch k := keys[c.pick(len(keys))]; k {
		case streamRoute:
			f.chaosStream(t, c, sid, body("stream"), bodies["control"], streamCodes, failed)
			continue
		case memoryRoute:
			if c.pick(2) == 0 {
				f.chaosMemory(t, sid, body("next"), streamCodes, failed)
				continue
			}
			method, path, b = "POST", "/v1/sessions/"+sid+"/memory", body("next") // no upgrade header: refused
		default:
			method, path, b = cases[k].make(sid)
		}
		req, err := http.NewRequest(method, "http://d"+path, bytes.NewReader(b))
		if err != nil {
			continue // a path http cannot carry
		}
		resp, err := f.client.Do(req)
		if err != nil {
			failed("%s %s body %x: no response: %v", method, path, b, err)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes[resp.StatusCode]++
		if resp.StatusCode >= 500 {
			failed("%s %s body %x: %d %q", method, path, b, resp.StatusCode, raw)
		}
		if path == "/v1/sessions" && method == "POST" && resp.StatusCode == 200 {
			var o wire.OpenResponse
			if msgpack.Unmarshal(raw, &o) == nil {
				f.call(t, "DELETE", "/v1/sessions/"+o.ID, nil, nil)
			}
		}
		if i%100 == 99 {
			if code := f.call(t, "GET", "/healthz", nil, nil); code != 200 {
				t.Fatalf("healthz after %d requests: %d", i+1, code)
			}
			if code := f.call(t, "GET", "/v1/sessions/"+live.ID+"/state", nil, nil); code == 404 {
				reopen()
			} else if c.pick(3) == 0 { // now and then, give back what the client holds
				f.call(t, "DELETE", "/v1/sessions/"+live.ID, nil, nil)
				reopen()
			}
		}
	}
	t.Logf("%d requests (seed %d), HTTP statuses %v, streams: %v", n, seed, codes, streamCodes)
	for _, s := range failures {
		t.Error(s)
	}
}

// chaosMemory asks for the batch memory of session id with the upgrade
// header and body: the answer, 101 and a frame or a refusal, must be
// under 500; codes counts it.
func (f *fixture) chaosMemory(t *testing.T, id string, body []byte, codes map[int]int, failed func(string, ...any)) {
	conn, err := net.Dial("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/sessions/%s/memory HTTP/1.1\r\nHost: d\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: %d\r\n\r\n%s", id, wire.MemoryUpgrade, len(body), body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		failed("memory %s body %x: no response: %v", id, body, err)
		return
	}
	codes[2000+resp.StatusCode]++ // 2000+status: a memory hand-over
	if resp.StatusCode >= 500 {
		raw, _ := io.ReadAll(resp.Body)
		failed("memory %s body %x: %d %q", id, body, resp.StatusCode, raw)
	}
}

// chaosStream opens a stream with body (mutated or not), sends mutated
// control frames, half-closes, and checks every answer: the HTTP status,
// and each error frame's status, must be under 500; codes counts them
// (an error frame's status as 1000+status).
func (f *fixture) chaosStream(t *testing.T, c *chaos, id string, body []byte, controls [][]byte, codes map[int]int, failed func(string, ...any)) {
	conn, err := net.Dial("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST /v1/sessions/%s/stream HTTP/1.1\r\nHost: d\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: %d\r\n\r\n%s", id, wire.StreamUpgrade, len(body), body)
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		failed("stream %s body %x: no response: %v", id, body, err)
		return
	}
	codes[resp.StatusCode]++
	if resp.StatusCode != http.StatusSwitchingProtocols {
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 500 {
			failed("stream %s body %x: %d %q", id, body, resp.StatusCode, raw)
		}
		return
	}
	var sent []byte
	for j := c.pick(4); j > 0; j-- {
		b := controls[c.pick(len(controls))]
		if c.pick(2) == 0 {
			b = c.mutate(b)
		}
		frame := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
		switch c.pick(8) {
		case 0:
			frame = binary.BigEndian.AppendUint32(nil, uint32(c.rng.Uint32())) // a length that lies
		case 1:
			frame = frame[:c.pick(4)] // a header cut short
		}
		frame = append(frame, b...)
		sent = append(sent, frame...)
		conn.Write(frame)
	}
	conn.(*net.UnixConn).CloseWrite()
	for {
		var n [4]byte
		if _, err := io.ReadFull(rd, n[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				failed("stream %s body %x frames %x: no end", id, body, sent)
			}
			return
		}
		b := make([]byte, binary.BigEndian.Uint32(n[:]))
		if _, err := io.ReadFull(rd, b); err != nil {
			return
		}
		var r wire.NextResponse
		if err := msgpack.Unmarshal(b, &r); err != nil {
			failed("stream %s: undecodable frame %x: %v", id, b, err)
			return
		}
		if r.Error != "" {
			codes[1000+r.ErrorStatus]++ // 1000+status: an error frame
		}
		if r.ErrorStatus >= 500 {
			failed("stream %s body %x frames %x: error frame %d %q", id, body, sent, r.ErrorStatus, r.Error)
		}
	}
}
