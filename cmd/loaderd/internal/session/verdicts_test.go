// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/cred"
	"github.com/nvfeed/nvfeed/internal/testenv"
)

// guardedTree is tree's dataset registered with a Watch guard in a
// manager of its own: its verdicts are cached.
func guardedTree(t *testing.T, cfg Config) (*Manager, *dataset) {
	t.Helper()
	ds := tree(t)
	dev, err := extentinfo.ResolveDevice(ds.Root)
	if err != nil {
		t.Skipf("cannot resolve the device of %s: %v", ds.Root, err)
	}
	ds.Device = dev
	searchable(t, ds.Root)
	cfg.Datasets = map[string]*bmap.Map{"d": ds}
	m := NewManager(cfg)
	t.Cleanup(func() { m.Stop() })
	d := m.data["d"]
	if d.guard == nil {
		t.Fatalf("dataset not registered: no verdict cache to test")
	}
	return m, d
}

// heldChecks replaces m's checks with ones that say they started (on
// started, by their credentials' groups) and then, those of uid 1001,
// wait for release or for their context's end.
type heldChecks struct {
	started chan string
	release chan struct{}
	mu      sync.Mutex
	ctxs    []context.Context // under mu: each check's, in order
}

func holdChecks(m *Manager) *heldChecks {
	h := &heldChecks{started: make(chan string, 16), release: make(chan struct{})}
	m.access.check = func(ctx context.Context, _ *bmap.Map, _ []int32, c *cred.Cred, _ *fresh.Guard, _ func(int)) (int, error) {
		h.mu.Lock()
		h.ctxs = append(h.ctxs, ctx)
		h.mu.Unlock()
		h.started <- keyOf(0, Caller{UID: int(c.UID), GID: int(c.GID), Groups: c.Groups}).groups
		if c.UID != 1001 {
			return -1, nil
		}
		select {
		case <-h.release:
		case <-ctx.Done():
		}
		return -1, nil
	}
	return h
}

// waiting reports how many checks of o's hold or wait for a turn.
func waiting(m *Manager, o owner) int {
	m.access.turns.mu.Lock()
	defer m.access.turns.mu.Unlock()
	if ot := m.access.turns.of[o]; ot != nil {
		return ot.users
	}
	return 0
}

// TestChecksTakeTurnsPerOwner: while one of uid 1001's checks runs, its
// second (other credentials: a group more) waits for its turn and
// starts only when the first ends, while uid 1002's check runs and
// answers at once; a caller waiting for a turn that goes away leaves
// without a check; two callers whose check waits for its turn share it.
func TestChecksTakeTurnsPerOwner(t *testing.T) {
	m, d := guardedTree(t, Config{})
	h := holdChecks(m)
	first, second, other := Caller{UID: 1001, GID: 1001}, Caller{UID: 1001, GID: 1001, Groups: []uint32{7}}, Caller{UID: 1002, GID: 1002}
	errs := make(chan error, 2)
	go func() { errs <- m.authorize(context.Background(), d, first) }()
	if g := <-h.started; g != "" {
		t.Fatalf("first check started for groups %q", g)
	}
	go func() { errs <- m.authorize(context.Background(), d, second) }()
	testenv.Eventually(t, "a second check waiting", func() bool { return waiting(m, first.owner()) >= 2 })
	done := make(chan error, 1)
	go func() { done <- m.authorize(context.Background(), d, other) }()
	<-h.started // uid 1002's, beside uid 1001's running one
	if err := <-done; err != nil {
		t.Fatalf("uid 1002 while uid 1001's check runs: %v", err)
	}
	select {
	case g := <-h.started:
		t.Fatalf("uid 1001's second check (groups %q) started while its first ran", g)
	default:
	}

	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() { gone <- m.authorize(ctx, d, Caller{UID: 1001, GID: 1001, Groups: []uint32{8}}) }()
	testenv.Eventually(t, "a third check waiting", func() bool { return waiting(m, first.owner()) >= 3 })
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Errorf("a caller gone while waiting for a turn: %v", err)
	}

	// Two callers with the same credentials while their check waits for
	// its turn: they share it (it judges after both came).
	nine := Caller{UID: 1001, GID: 1001, Groups: []uint32{9}}
	errs9 := make(chan error, 2)
	for range 2 {
		go func() { errs9 <- m.authorize(context.Background(), d, nine) }()
	}
	testenv.Eventually(t, "two requests waiting on uid 1001's check", func() bool {
		m.access.mu.Lock()
		defer m.access.mu.Unlock()
		p := m.access.checking[keyOf(d.id, nine)]
		return p != nil && p.waiters == 2
	})

	close(h.release) // the first ends; the second and the shared one run and end
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("uid 1001: %v", err)
		}
		if err := <-errs9; err != nil {
			t.Errorf("uid 1001, groups 9: %v", err)
		}
	}
	got := []string{<-h.started, <-h.started}
	slices.Sort(got)
	if !slices.Equal(got, []string{"7,", "9,"}) {
		t.Errorf("uid 1001's later checks: groups %q, want 7 and 9 (one each)", got)
	}
	if n := len(h.started); n != 0 {
		t.Errorf("%d more checks started, want none (the gone caller's never ran, the two with groups 9 shared one)", n)
	}
}

// TestCheckStopsWhenItsCallersLeave: two callers share one check; the
// first going away leaves it running for the second; when the second
// goes too the check's context ends, it is counted cancelled, and
// nothing is kept: the next caller checks again.
func TestCheckStopsWhenItsCallersLeave(t *testing.T) {
	m, d := guardedTree(t, Config{})
	h := holdChecks(m)
	c := Caller{UID: 1001, GID: 1001}
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	errs1, errs2 := make(chan error, 1), make(chan error, 1)
	go func() { errs1 <- m.authorize(ctx1, d, c) }()
	<-h.started
	go func() { errs2 <- m.authorize(ctx2, d, c) }()
	testenv.Eventually(t, "two requests waiting on one check", func() bool {
		m.access.mu.Lock()
		defer m.access.mu.Unlock()
		return m.access.checking[keyOf(d.id, c)].waiters == 2
	})
	cancel1()
	if err := <-errs1; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first caller gone: %v", err)
	}
	h.mu.Lock()
	check := h.ctxs[0]
	h.mu.Unlock()
	if check.Err() != nil {
		t.Fatalf("the check stopped while a caller still waits for it")
	}
	cancel2()
	if err := <-errs2; !errors.Is(err, context.Canceled) {
		t.Fatalf("the second caller gone: %v", err)
	}
	<-check.Done()
	testenv.Eventually(t, "the check counted cancelled", func() bool { return counted(m.access, scopeCancelled) == 1 })
	close(h.release)
	if err := m.authorize(context.Background(), d, c); err != nil {
		t.Fatalf("the next caller: %v", err)
	}
	if n := len(h.ctxs); n != 2 {
		t.Errorf("%d checks, want 2: a cancelled check's verdict was kept", n)
	}
	if n := counted(m.access, scopeFull); n != 1 {
		t.Errorf("%v full checks counted, want 1", n)
	}
}

// counted is how many checks of dataset d with scope v counted.
func counted(v *verdicts, scope string) float64 {
	var mm dto.Metric
	v.checks.WithLabelValues("d", scope).Write(&mm)
	return mm.GetCounter().GetValue()
}

// TestAddedListsOnlyChangedFolders: a dataset's count of added files is
// recounted listing again only the class folders its watch saw change:
// after a file is added to a, b keeps the count it had (here set to 5,
// which only a count that did not list b again would give), until a file
// is added to b too.
func TestAddedListsOnlyChangedFolders(t *testing.T) {
	m, d := guardedTree(t, Config{})
	recount := func() int {
		d.infoMu.Lock()
		d.infoAt = time.Time{} // past infoInterval
		d.infoMu.Unlock()
		info, _ := d.describe(time.Now(), m.log)
		return info.Added
	}
	if n := recount(); n != 0 {
		t.Fatalf("added %d before any change", n)
	}
	if err := os.WriteFile(filepath.Join(d.m.Root, "a", "new.jpg"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.infoMu.Lock()
	d.added["b"] = 5
	d.infoMu.Unlock()
	if n := recount(); n != 1+5 {
		t.Errorf("a file added to a, b's count kept at 5: added %d, want 6 (b listed again?)", n)
	}
	if err := os.WriteFile(filepath.Join(d.m.Root, "b", "new.jpg"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := recount(); n != 2 {
		t.Errorf("a file added to b too: added %d, want 2", n)
	}
}
