// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader"
)

// streamClient is a stream opened by hand on the unix socket.
type streamClient struct {
	t    *testing.T
	conn net.Conn
	rd   *bufio.Reader
}

// openStream opens a stream of session id, with req as its body when not
// nil.
func (f *fixture) openStream(t *testing.T, id string, req *wire.StreamRequest) *streamClient {
	conn, err := net.Dial("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	if req != nil {
		if body, err = msgpack.Marshal(req); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Fprintf(conn, "POST /v1/sessions/%s/stream HTTP/1.1\r\nHost: d\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: %d\r\n\r\n%s", id, wire.StreamUpgrade, len(body), body)
	rd := bufio.NewReader(conn)
	status, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(status, " 101 ") {
		t.Fatalf("stream: %q %v", status, err)
	}
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
	}
	return &streamClient{t: t, conn: conn, rd: rd}
}

// recv returns the next frame, or ok false when none comes within d.
func (c *streamClient) recv(d time.Duration) (wire.NextResponse, bool) {
	c.conn.SetReadDeadline(time.Now().Add(d))
	var n [4]byte
	if _, err := io.ReadFull(c.rd, n[:]); err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return wire.NextResponse{}, false
		}
		c.t.Fatalf("stream: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(n[:]))
	if _, err := io.ReadFull(c.rd, b); err != nil {
		c.t.Fatalf("stream: %v", err)
	}
	var r wire.NextResponse
	if err := msgpack.Unmarshal(b, &r); err != nil {
		c.t.Fatal(err)
	}
	return r, true
}

func (c *streamClient) send(v wire.StreamControl) {
	b, _ := msgpack.Marshal(v)
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := c.conn.Write(append(n[:], b...)); err != nil {
		c.t.Fatal(err)
	}
}

// openThreeSlots opens a session of batches of 3 with three slots:
// prefetch 1, release_after 1, and one more.
func (f *fixture) openThreeSlots(t *testing.T) wire.OpenResponse {
	t.Helper()
	var open wire.OpenResponse
	ra := 1
	if code := f.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 3, NumShards: 1}, PrefetchQueueDepth: new(1), ReleaseAfter: &ra}}, &open); code != 200 {
		t.Fatalf("open: %d", code)
	}
	if open.Memory.Slots != 3 {
		t.Fatalf("slots %d, want prefetch 1 + release_after 1 + 1", open.Memory.Slots)
	}
	return open
}

// TestStreamLifetimes: a stream pushes no more batches than the session
// has slots while the client holds them; releases out of order let it go
// on and never touch a batch still held; a stop keeps what the client
// names; after a client died, a new stream that keeps nothing gets every
// slot back.
func TestStreamLifetimes(t *testing.T) {
	f := start(t, time.Minute)
	open := f.openThreeSlots(t)
	mem, mr := f.memory(t, open.ID)
	if mr.Memory != open.Memory {
		t.Fatalf("memory frame %+v, open response %+v: the description must arrive unchanged", mr.Memory, open.Memory)
	}
	check := func(r wire.NextResponse) {
		t.Helper()
		for i, idx := range r.Indices {
			want, _ := os.ReadFile(filepath.Join(f.m.Root, f.m.Samples[idx].Path))
			if !bytes.Equal(mem[r.Offsets[i]:r.Offsets[i]+r.Lengths[i]], want) {
				t.Fatalf("epoch %d batch %d: sample %d differs from its file", r.Epoch, r.Iteration, idx)
			}
		}
	}
	s := f.openStream(t, open.ID, nil)
	var got []wire.NextResponse
	for len(got) < 3 {
		r, ok := s.recv(5 * time.Second)
		if !ok {
			t.Fatalf("only %d batches pushed", len(got))
		}
		got = append(got, r)
	}
	if _, ok := s.recv(300 * time.Millisecond); ok {
		t.Fatal("a fourth batch came while the client held all 3 slots")
	}
	// Out of order: give back the second; the first and third stay intact.
	s.send(wire.StreamControl{Release: []int{got[1].Slot}})
	r, ok := s.recv(5 * time.Second)
	if !ok || r.Iteration != 3 {
		t.Fatalf("after a release: %+v %v, want batch 3", r, ok)
	}
	check(got[0])
	check(got[2])
	check(r)
	s.send(wire.StreamControl{Release: []int{got[0].Slot, r.Slot}})
	for i := 0; i < 2; i++ {
		if r, ok := s.recv(5 * time.Second); !ok {
			t.Fatal("no batch after two releases")
		} else {
			check(r)
			got = append(got, r)
		}
	}
	check(got[2])
	// A stop keeping one slot: every other delivered batch goes back.
	kept := got[2].Slot
	s.send(wire.StreamControl{Stop: true, Keep: []int{kept}})
	for {
		r, ok := s.recv(5 * time.Second)
		if !ok {
			t.Fatal("no answer to the stop")
		}
		if r.Stopped {
			break
		}
	}
	s.conn.Close()
	// The kept batch is held: releasing it works once, and the HTTP path
	// works again.
	if code := f.call(t, "POST", "/v1/sessions/"+open.ID+"/release", wire.ReleaseRequest{Slot: kept}, nil); code != 204 {
		t.Errorf("release of the kept slot: %d", code)
	}
	if code := f.call(t, "POST", "/v1/sessions/"+open.ID+"/release", wire.ReleaseRequest{Slot: got[3].Slot}, nil); code != 400 {
		t.Errorf("release of a slot the stop gave back: %d, want 400", code)
	}
	var nb wire.NextResponse
	if code := f.call(t, "POST", "/v1/sessions/"+open.ID+"/next", nil, &nb); code != 200 {
		t.Fatalf("next after the stream: %d", code)
	}
	f.call(t, "POST", "/v1/sessions/"+open.ID+"/release", wire.ReleaseRequest{Slot: nb.Slot}, nil)
	// A client that dies mid-stream, holding everything: a new stream that
	// keeps nothing gets the full window again.
	s = f.openStream(t, open.ID, nil)
	for held := 0; held < 3; {
		r, ok := s.recv(5 * time.Second)
		if !ok {
			t.Fatal("second stream: too few batches")
		}
		if !r.EndOfEpoch {
			held++
		}
	}
	s.conn.Close()
	var s2 *streamClient
	for i := 0; i < 100; i++ { // the first stream ends asynchronously
		s2 = f.openStream(t, open.ID, nil)
		if r, ok := s2.recv(2 * time.Second); ok && r.Error == "" {
			break
		}
		s2.conn.Close()
		time.Sleep(20 * time.Millisecond)
	}
	n := 1
	for ; n < 3; n++ {
		if _, ok := s2.recv(5 * time.Second); !ok {
			break
		}
	}
	if n != 3 {
		t.Errorf("after a client died holding every slot, a new stream got %d batches, want all 3 slots back", n)
	}
	// A malformed control frame ends the stream with an error that says so.
	s2.conn.Write([]byte{0, 0, 0, 3, 0xc1, 0xc1, 0xc1})
	for {
		r, ok := s2.recv(5 * time.Second)
		if !ok {
			t.Fatal("a malformed control frame: no answer")
		}
		if r.Error != "" {
			if !strings.Contains(r.Error, "stream control: malformed control frame") {
				t.Errorf("error %q, want it to name the malformed control frame", r.Error)
			}
			break
		}
	}
	s2.conn.Close()
}

// TestStreamBrokenKeepsBatches: a stream whose connection breaks leaves
// the batches it delivered held (the client may still be using them: its
// reads must not overwrite them), and the next stream's keep says which
// of them the client still holds; every other one is released.
func TestStreamBrokenKeepsBatches(t *testing.T) {
	f := start(t, time.Minute)
	open := f.openThreeSlots(t)
	mem, _ := f.memory(t, open.ID)
	// The bytes each held sample had when delivered, checked against its file.
	type held struct {
		r     wire.NextResponse
		bytes [][]byte
	}
	take := func(r wire.NextResponse) held {
		t.Helper()
		h := held{r: r}
		for i, idx := range r.Indices {
			b := bytes.Clone(mem[r.Offsets[i] : r.Offsets[i]+r.Lengths[i]])
			if want, _ := os.ReadFile(filepath.Join(f.m.Root, f.m.Samples[idx].Path)); !bytes.Equal(b, want) {
				t.Fatalf("epoch %d batch %d: sample %d differs from its file", r.Epoch, r.Iteration, idx)
			}
			h.bytes = append(h.bytes, b)
		}
		return h
	}
	unchanged := func(h held) {
		t.Helper()
		for i := range h.r.Indices {
			if !bytes.Equal(mem[h.r.Offsets[i]:h.r.Offsets[i]+h.r.Lengths[i]], h.bytes[i]) {
				t.Fatalf("batch %d (slot %d), held by the client, was overwritten", h.r.Iteration, h.r.Slot)
			}
		}
	}
	s := f.openStream(t, open.ID, nil)
	var a, b held
	for i, h := range []*held{&a, &b} {
		r, ok := s.recv(5 * time.Second)
		if !ok || r.EndOfEpoch {
			t.Fatalf("batch %d: %+v %v", i, r, ok)
		}
		*h = take(r)
	}
	s.conn.Close() // broken, not stopped: the client still uses a and b
	time.Sleep(300 * time.Millisecond)
	unchanged(a)
	unchanged(b)
	// A new stream keeping a and b: the session has one slot left.
	s = f.openStream(t, open.ID, &wire.StreamRequest{Keep: []int{a.r.Slot, b.r.Slot}})
	var c wire.NextResponse
	for i := 0; i < 100; i++ { // the broken stream ends asynchronously
		r, ok := s.recv(2 * time.Second)
		if ok && r.Error == "" {
			c = r
			break
		}
		s.conn.Close()
		time.Sleep(20 * time.Millisecond)
		s = f.openStream(t, open.ID, &wire.StreamRequest{Keep: []int{a.r.Slot, b.r.Slot}})
	}
	if c.Slot == a.r.Slot || c.Slot == b.r.Slot {
		t.Fatalf("batch %d came in slot %d, which the client keeps", c.Iteration, c.Slot)
	}
	take(c)
	if r, ok := s.recv(300 * time.Millisecond); ok {
		t.Fatalf("batch %d (slot %d) came while the client held all 3 slots", r.Iteration, r.Slot)
	}
	unchanged(a)
	unchanged(b)
	// Releasing a lets exactly one more come, in a's slot.
	s.send(wire.StreamControl{Release: []int{a.r.Slot}})
	r, ok := s.recv(5 * time.Second)
	if !ok || r.Slot != a.r.Slot {
		t.Fatalf("after releasing slot %d: %+v %v", a.r.Slot, r, ok)
	}
	take(r)
	unchanged(b)
	s.conn.Close()
}

// TestClientCloseIsNotAWarning: a client that ends its stream by closing
// the connection, or takes its memory and goes, is how clients end: the
// daemon logs no warning for it. A broken frame still warns.
func TestClientCloseIsNotAWarning(t *testing.T) {
	var logs testenv.Buffer
	f := startWith(t, Config{SessionTimeout: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	o := f.openThreeSlots(t)
	f.memory(t, o.ID)
	c := f.openStream(t, o.ID, nil)
	nb, ok := c.recv(5 * time.Second)
	if !ok {
		t.Fatal("no batch on the stream")
	}
	// Give a batch back and go while the next frame waits unread: the
	// daemon's side sees ECONNRESET, as when a training process exits.
	c.send(wire.StreamControl{Release: []int{nb.Slot}})
	time.Sleep(100 * time.Millisecond)
	c.conn.Close()
	time.Sleep(200 * time.Millisecond) // the daemon sees the close
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a client's close was logged as a warning:\n%s", logs.String())
	}
	for _, tc := range []struct {
		err  error
		want slog.Level
	}{
		{io.EOF, slog.LevelDebug},
		{io.ErrUnexpectedEOF, slog.LevelDebug},
		{net.ErrClosed, slog.LevelDebug},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), slog.LevelDebug},
		{fmt.Errorf("write: %w", syscall.EPIPE), slog.LevelDebug},
		{errors.New("control frame: release slot 7 of 3"), slog.LevelWarn},
	} {
		if got := closeLevel(tc.err); got != tc.want {
			t.Errorf("closeLevel(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
