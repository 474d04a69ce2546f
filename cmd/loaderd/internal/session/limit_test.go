// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// TestMaxSessionsConcurrent: opens racing past the session limit never
// exceed it (the check and the insertion are one step), and every refused
// open says why with ErrLimit.
func TestMaxSessionsConcurrent(t *testing.T) {
	const limit, opens = 2, 16
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": tree(t)}, MaxSessions: limit})
	defer m.Stop()
	me := Caller{UID: os.Getuid(), GID: os.Getgid()} // the owner of tree()
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, opens)
	for i := range opens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = m.Open(context.Background(), me, OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}})
		}()
	}
	close(start)
	wg.Wait()
	var opened int
	for _, err := range errs {
		switch {
		case err == nil:
			opened++
		case !errors.Is(err, ErrLimit):
			t.Errorf("open: %v (want success or ErrLimit)", err)
		}
	}
	if opened != limit {
		t.Errorf("%d concurrent opens with MaxSessions %d: %d sessions opened, want exactly %d", opens, limit, opened, limit)
	}
	if n := len(m.snapshot()); n > limit {
		t.Errorf("%d sessions open, over the limit of %d", n, limit)
	}
}

// TestAdmissionLimits: the sessions of one owner are bounded
// (MaxSessionsPerUID, ErrLimit naming the uid) without stopping another
// owner's; the batch memory of all sessions is bounded (MaxLockedBytes,
// ErrNoSpace naming the budget and what is in use), so is one owner's
// share of it (MaxLockedPerUID, half by default: no uid starves the
// others), and closing a session frees its share.
func TestAdmissionLimits(t *testing.T) {
	asRoot(t)
	ds := tree(t)
	searchable(t, ds.Root)
	params := OpenParams{Dataset: "d", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}}
	lo, err := params.Options()
	if err != nil {
		t.Fatal(err)
	}
	plan, err := loader.NewPlan(ds, lo)
	if err != nil {
		t.Fatal(err)
	}
	one := plan.Footprint.Host // one session's batch memory
	me := Caller{UID: os.Getuid(), GID: os.Getgid()}
	other := Caller{UID: 4242, GID: 4242}
	tcp := Caller{UID: me.UID, GID: me.GID, TCP: true} // the same uid over TCP is another owner
	type step struct {
		c     Caller
		close int   // > 0: close the session opened at this step (1-based) instead of opening
		want  error // nil: opened
		msg   string
	}
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"sessions per uid", Config{MaxSessionsPerUID: 2, MaxLockedBytes: 100 * one}, []step{
			{c: me}, {c: me}, {c: me, want: ErrLimit, msg: fmt.Sprintf("uid %d has 2 sessions open, the daemon's limit per uid", me.UID)},
			{c: other}, {c: tcp}, {c: tcp}, {c: tcp, want: ErrLimit, msg: "TCP principal"},
			{close: 1}, {c: me},
		}},
		{"batch memory budget", Config{MaxLockedBytes: 2*one + one/2, MaxLockedPerUID: 100 * one}, []step{
			{c: me}, {c: other}, {c: tcp, want: ErrNoSpace, msg: fmt.Sprintf("budget of %d MiB", mib(2*one+one/2))},
			{close: 2}, {c: tcp}, {c: me, want: ErrNoSpace, msg: fmt.Sprintf("open sessions' (%d MiB)", mib(2*one))},
		}},
		{"a uid's share of the budget", Config{MaxLockedBytes: 4*one + one/2, MaxLockedPerUID: 2*one + one/2}, []step{
			{c: me}, {c: me}, {c: me, want: ErrNoSpace, msg: fmt.Sprintf("one uid's share of the batch memory budget, %d MiB", mib(2*one+one/2))},
			{c: other}, {c: other}, {close: 1}, {c: me},
		}},
		{"half the budget by default", Config{MaxLockedBytes: 3 * one}, []step{
			{c: me}, {c: me, want: ErrNoSpace, msg: "one uid's share"}, {c: other},
		}},
		{"a session larger than the budget", Config{MaxLockedBytes: one - 1}, []step{
			{c: me, want: ErrNoSpace},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Datasets = map[string]*bmap.Map{"d": ds}
			m := NewManager(tt.cfg)
			defer m.Stop()
			ids := make([]string, len(tt.steps))
			for i, s := range tt.steps {
				if s.close > 0 {
					c := tt.steps[s.close-1].c
					if err := m.Close(c, ids[s.close-1]); err != nil {
						t.Fatalf("step %d: close: %v", i+1, err)
					}
					continue
				}
				o, err := m.Open(context.Background(), s.c, params)
				ids[i] = o.ID
				switch {
				case s.want == nil && err != nil:
					t.Fatalf("step %d: open as %+v: %v", i+1, s.c, err)
				case s.want != nil && (!errors.Is(err, s.want) || !strings.Contains(fmt.Sprint(err), s.msg)):
					t.Fatalf("step %d: open as %+v: err = %v, want %v saying %q", i+1, s.c, err, s.want, s.msg)
				}
			}
			if inUse, _ := m.Locked(); inUse != int64(len(m.snapshot()))*one {
				t.Errorf("%d bytes reserved for %d sessions of %d bytes", inUse, len(m.snapshot()), one)
			}
		})
	}
}
