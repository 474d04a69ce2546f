// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// TestDeliver drives the delivery state machine (deliver.go: Next,
// Stream, Release, ReleaseExcept; Close, Reap, a daemon restart) at the
// Manager's own boundary, no transport, from the files in
// testdata/deliver. Batches are named by position, EPOCH.ITERATION, never
// by slot (which slot a batch gets is the loader's choice); the driver
// finds a held batch's slot. Commands:
//
//	open [batch=N] [prefetch=N] [release_after=N]   a session over 12 samples (shuffled, seed 7)
//	next [release=(E.I, ...)] [at=E.I]              Manager.Next: "batch E.I [samples]" or "end of epoch E"
//	release E.I | release slot=N                    Manager.Release (from any goroutine, as a stream's control frames)
//	held                                            the batches the session holds; "?" marks one handed to the
//	                                                stream that the client never received
//	state                                           Manager.State: the position of the daemon's next batch
//	stream start [keep=(E.I, ...)] [at=E.I]         Manager.Stream in the background, as serve runs it
//	stream deliver [n=N]                            the client takes N frames; each is printed with the batches
//	                                                held when it was sent; "blocked" when none can come
//	stream break                                    the connection breaks: the stream's context ends, nothing else
//	stream stop [keep=(E.I, ...)]                   the client stops: the stream ends, then ReleaseExcept(keep)
//	close                                           Manager.Close
//	reap idle=DURATION                              Manager.Reap as if DURATION had passed
//	restart                                         the daemon stops (Manager.Stop) and a new one opens the
//	                                                session again at the client's own position, as LoaderSource does
//
// Every command that looks at the session first waits for a running
// stream to settle: its next frame handed out, or every slot held by
// batches the client has, or the stream ended. With that, every output
// is determined.
func TestDeliver(t *testing.T) {
	root := t.TempDir()
	for i := range 12 {
		p := filepath.Join(root, fmt.Sprintf("c%d", i%3), fmt.Sprintf("%02d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, 100+i*10), 0o644)
	}
	ds := testfs.MapDir(t, root)
	datadriven.Walk(t, "testdata/deliver", func(t *testing.T, path string) {
		d := &deliverDriver{t: t, ds: ds}
		defer d.stop()
		datadriven.RunTest(t, path, d.run)
	})
}

// pos names a batch.
type pos struct{ epoch, iteration int }

func (p pos) String() string { return fmt.Sprintf("%d.%d", p.epoch, p.iteration) }

func parsePos(t *testing.T, s string) pos {
	t.Helper()
	e, i, ok := strings.Cut(s, ".")
	ep, err1 := strconv.Atoi(e)
	it, err2 := strconv.Atoi(i)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("position %q: want EPOCH.ITERATION", s)
	}
	return pos{ep, it}
}

// frame is one delivery handed to the stream's out, with the batches the
// session held at that moment.
type frame struct {
	d    Delivery
	held string
}

// streamRun is a stream running in the background.
type streamRun struct {
	cancel context.CancelFunc
	frames chan frame // out's deliveries, one at a time
	taken  chan error // the client's answer to each: nil, it took it
	done   chan error // Stream's result
	ended  bool
	err    error
}

type deliverDriver struct {
	t      *testing.T
	ds     *bmap.Map
	m      *Manager
	me     Caller
	id     string
	opened Opened
	client map[pos]bool // batches the client has and has not released
	next   pos          // the client's position: the batch it wants next
	s      *streamRun
	queued *frame // a frame out offered that the client has not taken
}

func (d *deliverDriver) manager() *Manager {
	return NewManager(Config{Datasets: map[string]*bmap.Map{"d": d.ds}, SessionTimeout: time.Minute,
		MaxLockedBytes: 1 << 30, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func (d *deliverDriver) stop() {
	if d.s != nil && !d.s.ended {
		d.s.cancel()
		d.s.err, d.s.ended = <-d.s.done, true
	}
	if d.m != nil {
		d.m.Stop()
	}
}

// out is the stream's sink: it offers each delivery to the client and
// waits for it to be taken, or for the stream's end.
func (s *streamRun) out(ctx context.Context, d Delivery, held func() string) error {
	select {
	case s.frames <- frame{d, held()}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-s.taken:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// session returns the open session (nil when it is gone).
func (d *deliverDriver) session() *session {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	return d.m.sessions[d.id]
}

// held lists the batches the session holds, in order; "?" marks those
// the client does not have.
func (d *deliverDriver) held() string {
	ss := d.session()
	if ss == nil {
		return "no session"
	}
	ss.heldMu.Lock()
	var ps []pos
	for _, b := range ss.held {
		ps = append(ps, pos{b.Epoch, b.Iteration})
	}
	ss.heldMu.Unlock()
	slices.SortFunc(ps, func(a, b pos) int { return cmp.Or(a.epoch-b.epoch, a.iteration-b.iteration) })
	var out []string
	for _, p := range ps {
		s := p.String()
		if !d.client[p] {
			s += "?"
		}
		out = append(out, s)
	}
	return fmt.Sprintf("[%s] %d of %d slots", strings.Join(out, " "), len(ps), ss.slots)
}

// heldAt lists the batches the session holds, for the stream's
// goroutine: it reads nothing of the driver's but the session.
func (d *deliverDriver) heldAt() string {
	ss := d.session()
	if ss == nil {
		return "no session"
	}
	ss.heldMu.Lock()
	var ps []pos
	for _, b := range ss.held {
		ps = append(ps, pos{b.Epoch, b.Iteration})
	}
	ss.heldMu.Unlock()
	slices.SortFunc(ps, func(a, b pos) int { return cmp.Or(a.epoch-b.epoch, a.iteration-b.iteration) })
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return "[" + strings.Join(out, " ") + "]"
}

// blocked says whether a running stream cannot go on: every slot held by
// a batch the client has.
func (d *deliverDriver) blocked() bool {
	ss := d.session()
	if ss == nil {
		return false
	}
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	if len(ss.held) < ss.slots {
		return false
	}
	for _, b := range ss.held {
		if !d.client[pos{b.Epoch, b.Iteration}] {
			return false
		}
	}
	return true
}

// settle waits for a running stream to reach a state that no longer
// changes by itself: a frame offered, blocked, or ended.
func (d *deliverDriver) settle() {
	s := d.s
	if s == nil || s.ended || d.queued != nil {
		return
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case f := <-s.frames:
			d.queued = &f
			return
		case err := <-s.done:
			s.err, s.ended = err, true
			return
		case <-deadline:
			d.t.Fatalf("the stream neither sent a frame nor ended in 10 s; held %s", d.held())
		case <-time.After(5 * time.Millisecond):
			if d.blocked() {
				// Blocked only if it stays so: a release may be on its way.
				// An end of epoch takes no slot: it may still come.
				time.Sleep(20 * time.Millisecond)
				select {
				case f := <-s.frames:
					d.queued = &f
					return
				default:
				}
				if d.blocked() {
					return
				}
			}
		}
	}
}

// slot finds the slot of a held batch.
func (d *deliverDriver) slot(p pos) int {
	ss := d.session()
	if ss == nil {
		return -1
	}
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	for slot, b := range ss.held {
		if b.Epoch == p.epoch && b.Iteration == p.iteration {
			return slot
		}
	}
	return MaxSlots - 1 // held by no slot: the session says so
}

func (d *deliverDriver) positions(td *datadriven.TestData, key string) ([]pos, []int) {
	arg, ok := td.Arg(key)
	if !ok {
		return nil, nil
	}
	var ps []pos
	var slots []int
	for _, v := range arg.Vals {
		p := parsePos(d.t, v)
		ps = append(ps, p)
		slots = append(slots, d.slot(p))
	}
	return ps, slots
}

func (d *deliverDriver) at(td *datadriven.TestData) *Position {
	arg, ok := td.Arg("at")
	if !ok {
		return nil
	}
	p := parsePos(d.t, arg.SingleVal(d.t))
	return &Position{p.epoch, p.iteration}
}

// describe prints a delivery, and moves the client's position past it.
func (d *deliverDriver) describe(v Delivery) string {
	if v.EndOfEpoch {
		d.next = pos{v.Epoch, 0} // the frame names the epoch that follows
		return fmt.Sprintf("end of epoch; epoch %d next (%d batches)", v.Epoch, v.EpochBatches)
	}
	p := pos{v.Epoch, v.Iteration}
	d.client[p] = true
	d.next = pos{v.Epoch, v.Iteration + 1}
	return fmt.Sprintf("batch %s samples %v", p, v.Indices)
}

// clockTime is a time of day in a message (a reaped session's).
var clockTime = regexp.MustCompile(`\b\d\d:\d\d:\d\d\b`)

// errString is err's message with the session's id replaced by S and
// times of day by HH:MM:SS.
func (d *deliverDriver) errString(err error) string {
	msg := clockTime.ReplaceAllString(err.Error(), "HH:MM:SS")
	if d.id == "" {
		return "error: " + msg
	}
	return "error: " + strings.ReplaceAll(msg, d.id, "S")
}

func (d *deliverDriver) open(td *datadriven.TestData, state *loader.State) string {
	batch, prefetch, releaseAfter := 2, 1, 1
	td.MaybeScanArgs(d.t, "batch", &batch)
	td.MaybeScanArgs(d.t, "prefetch", &prefetch)
	td.MaybeScanArgs(d.t, "release_after", &releaseAfter)
	if d.m == nil {
		d.m = d.manager()
		d.me = Caller{UID: os.Getuid(), GID: os.Getgid()}
	}
	o, err := d.m.Open(context.Background(), d.me, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: batch, NumShards: 1, RandomShuffle: true, Seed: 7}, PrefetchQueueDepth: &prefetch, ReleaseAfter: &releaseAfter, State: state}})
	if err != nil {
		return d.errString(err)
	}
	d.id, d.opened, d.client, d.next, d.s, d.queued = o.ID, o, map[pos]bool{}, pos{o.Epoch, o.Iteration}, nil, nil
	return fmt.Sprintf("opened: %d slots, first batch %d.%d of %d", o.Memory.Slots, o.Epoch, o.Iteration, o.EpochBatches)
}

func (d *deliverDriver) run(t *testing.T, td *datadriven.TestData) string {
	d.t = t
	if td.Cmd != "open" && d.m == nil {
		t.Fatalf("%s: open first", td.Pos)
	}
	switch td.Cmd {
	case "open":
		return d.open(td, nil)
	case "next":
		d.settle()
		ps, slots := d.positions(td, "release")
		v, err := d.m.Next(context.Background(), d.me, d.id, slots, d.at(td))
		if err != nil {
			return d.errString(err)
		}
		for _, p := range ps {
			delete(d.client, p)
		}
		return d.describe(v)
	case "release":
		d.settle()
		var slot int
		var p pos
		if td.HasArg("slot") {
			td.ScanArgs(t, "slot", &slot)
		} else {
			p = parsePos(t, td.CmdArgs[0].Key)
			slot = d.slot(p)
		}
		if err := d.m.Release(d.me, d.id, slot); err != nil {
			return d.errString(err)
		}
		delete(d.client, p)
		d.settle() // a stream that was blocked may go on
		return "held " + d.held()
	case "held":
		d.settle()
		return d.held()
	case "state":
		d.settle()
		st, err := d.m.State(d.me, d.id)
		if err != nil {
			return d.errString(err)
		}
		return fmt.Sprintf("next batch %d.%d", st.Epoch, st.Batch)
	case "stream":
		return d.stream(td)
	case "close":
		d.settle()
		if err := d.m.Close(d.me, d.id); err != nil {
			return d.errString(err)
		}
		d.settle()
		return "closed"
	case "reap":
		d.settle()
		var s string
		td.ScanArgs(t, "idle", &s)
		idle, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		d.m.Reap(time.Now().Add(idle))
		d.settle()
		if d.session() == nil {
			return "reaped"
		}
		return "kept: held " + d.held()
	case "restart":
		d.stop()
		st := d.opened.State
		st.Epoch, st.Batch = d.next.epoch, d.next.iteration
		d.m = nil
		return d.open(td, &st)
	}
	t.Fatalf("%s: unknown command %q", td.Pos, td.Cmd)
	return ""
}

func (d *deliverDriver) stream(td *datadriven.TestData) string {
	t := d.t
	if len(td.CmdArgs) == 0 {
		t.Fatalf("%s: stream start, deliver, break or stop", td.Pos)
	}
	switch td.CmdArgs[0].Key {
	case "start":
		d.settle()
		ps, keep := d.positions(td, "keep")
		kept := map[pos]bool{}
		for _, p := range ps {
			if d.client[p] {
				kept[p] = true
			}
		}
		d.client = kept // what the client still holds: the rest it gave up
		ctx, cancel := context.WithCancel(context.Background())
		s := &streamRun{cancel: cancel, frames: make(chan frame), taken: make(chan error), done: make(chan error, 1)}
		d.s, d.queued = s, nil
		at := d.at(td)
		go func() {
			s.done <- d.m.Stream(ctx, d.me, d.id, at, keep, func(v Delivery) error { return s.out(ctx, v, d.heldAt) })
		}()
		d.settle()
		if s.ended {
			return d.ended()
		}
		return "streaming"
	case "deliver":
		n := 1
		td.MaybeScanArgs(t, "n", &n)
		var out []string
		for range n {
			d.settle()
			if d.s == nil || d.s.ended {
				out = append(out, d.ended())
				break
			}
			if d.queued == nil {
				out = append(out, "blocked: held "+d.held())
				break
			}
			f := *d.queued
			d.queued = nil
			d.s.taken <- nil
			out = append(out, d.describe(f.d)+"; held when sent "+f.held)
		}
		return strings.Join(out, "\n")
	case "break":
		d.settle()
		d.s.cancel()
		d.s.err, d.s.ended = <-d.s.done, true
		d.queued = nil // lost with the connection
		return d.ended() + "; held " + d.held()
	case "stop":
		d.settle()
		ps, keep := d.positions(td, "keep")
		d.s.cancel()
		d.s.err, d.s.ended = <-d.s.done, true
		d.queued = nil
		if err := d.m.ReleaseExcept(d.me, d.id, keep); err != nil {
			return d.errString(err)
		}
		kept := map[pos]bool{}
		for _, p := range ps {
			if d.client[p] {
				kept[p] = true
			}
		}
		d.client = kept
		return "stopped; held " + d.held()
	}
	t.Fatalf("%s: unknown stream command %q", td.Pos, td.CmdArgs[0].Key)
	return ""
}

// ended says how the stream ended.
func (d *deliverDriver) ended() string {
	if d.s == nil {
		return "no stream"
	}
	if d.s.err != nil {
		return "stream ended: " + d.errString(d.s.err)
	}
	return "stream ended"
}
