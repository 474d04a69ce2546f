// SPDX-License-Identifier: Apache-2.0

package session

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// readEpoch reads one epoch of session id as c and returns the failures'
// messages by sample path, and how many samples were delivered.
func readEpoch(t *testing.T, m *Manager, c Caller, ds *bmap.Map, id string) (failed map[string]string, served int) {
	t.Helper()
	failed = map[string]string{}
	var rel []int
	for {
		d, err := m.Next(context.Background(), c, id, rel, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.EndOfEpoch {
			return failed, served
		}
		rel = []int{d.Slot}
		served += len(d.Indices) - len(d.Failed)
		for j, pos := range d.Failed {
			failed[ds.Samples[d.Indices[pos]].Path] = d.Errors[j]
		}
	}
}

// classFolders maps train/cC/I.jpg (C < classes, I < 4) on a new ext4
// others may reach, each file 5000+I bytes of 'a'+C.
func classFolders(t *testing.T, classes int) (*testfs.FS, *bmap.Map) {
	t.Helper()
	fs := testfs.New(t, testfs.Ext4())
	reachable(fs.Dir)
	for c := range classes {
		for i := range 4 {
			fs.WriteFile(t, fmt.Sprintf("train/c%d/%d.jpg", c, i), bytes.Repeat([]byte{byte('a' + c)}, 5000+i))
		}
	}
	fs.Sync(t)
	ds, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return fs, ds
}

// watched returns m as a registered dataset "ds" with a watch, closed at the test's end.
func watched(t *testing.T, m *bmap.Map) *dataset {
	t.Helper()
	g, err := fresh.Open(m, fresh.Watch, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return &dataset{id: 1, name: "ds", m: m, guard: g}
}

// allSamples returns every sample index of m, in order.
func allSamples(m *bmap.Map) []int {
	all := make([]int, len(m.Samples))
	for i := range all {
		all[i] = i
	}
	return all
}

// TestOpenChecksSamplesAsRead: a session's open asks of the caller only
// the dataset's root; each sample is opened as the caller before its
// first read, so one the caller may not read fails in the stream, named
// only as far as the caller may list it, and the rest is served, for
// every backend. The root refused is still a 403 at the open. Before,
// the open opened every sample as the caller and refused the whole
// dataset with 403.
func TestOpenChecksSamplesAsRead(t *testing.T) {
	asRoot(t)
	fs, ds := classFolders(t, 3)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chmod(fs.Path("train", "c0", "1.jpg"), 0o600)) // nobody may not read it
	must(os.Chmod(fs.Path("train", "c2"), 0o711))          // nobody may reach c2's files, not list them
	must(os.Chmod(fs.Path("train", "c2", "3.jpg"), 0o600))
	var logs testenv.Buffer
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer m.Stop()
	nobodyC := Caller{UID: nobody, GID: nobody}
	for _, be := range []string{"file", "gds", "bam"} {
		t.Run(be, func(t *testing.T) {
			o, err := m.Open(context.Background(), nobodyC, OpenParams{Dataset: "d", Request: loader.Request{Backend: be, ReaderArgs: loader.ReaderArgs{BatchSize: 5, NumShards: 1}}})
			if err != nil {
				t.Fatalf("open as nobody: %v", err)
			}
			defer m.Close(nobodyC, o.ID)
			for e := range 2 {
				failed, served := readEpoch(t, m, nobodyC, ds, o.ID)
				if served != 10 || len(failed) != 2 {
					t.Fatalf("epoch %d: %d served, failed %v; want 10 served, c0/1.jpg and c2/3.jpg failed", e, served, failed)
				}
				if msg := failed["c0/1.jpg"]; !strings.Contains(msg, "c0/1.jpg") || !strings.Contains(msg, "permission denied") {
					t.Errorf("epoch %d: c0/1.jpg failed with %q, want it named and permission denied", e, msg)
				}
				if msg := failed["c2/3.jpg"]; strings.Contains(msg, "3.jpg") || !strings.Contains(msg, "c2/…") || !strings.Contains(msg, "permission denied") {
					t.Errorf("epoch %d: c2/3.jpg (in a folder nobody may not list) failed with %q, want c2/… and permission denied", e, msg)
				}
			}
		})
	}
	must(os.Chmod(fs.Path("train"), 0o700))
	defer os.Chmod(fs.Path("train"), 0o755)
	if _, err := m.Open(context.Background(), nobodyC, OpenParams{Dataset: "d", Request: loader.Request{Backend: "gds", ReaderArgs: loader.ReaderArgs{BatchSize: 5, NumShards: 1}}}); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("open as nobody of a 0700 root: %v, want ErrForbidden", err)
	}
}

// TestOpenReportsNotRaw: a raw session's open tells which raw-mapped
// samples are read through the filesystem and why, with the fix, as
// loaderd status does; a file session's tells nothing. Before, the open
// said nothing of them.
func TestOpenReportsNotRaw(t *testing.T) {
	asRoot(t)
	fs := testfs.New(t, testfs.Ext4())
	for i := range 6 {
		fs.WriteFile(t, fmt.Sprintf("train/c/%d.jpg", i), bytes.Repeat([]byte{byte(i)}, 8192))
	}
	fs.Sync(t)
	ds, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(fs.Path("train", "c", "0.jpg"), 0o640); err != nil { // changed since mapping
		t.Fatal(err)
	}
	for _, f := range []string{"1.jpg", "2.jpg"} { // a user the daemon does not trust owns them
		if err := os.Lchown(fs.Path("train", "c", f), 43117, 43117); err != nil {
			t.Fatal(err)
		}
	}
	ds2 := *ds // the chown moved their ctimes: map them again, unchanged
	ds2.Samples = slices.Clone(ds.Samples)
	for i := range ds2.Samples {
		if p := ds2.Samples[i].Path; p == "c/1.jpg" || p == "c/2.jpg" {
			var st unix.Stat_t
			if err := unix.Stat(fs.Path("train", p), &st); err != nil {
				t.Fatal(err)
			}
			ds2.Samples[i].CtimeNs = st.Ctim.Nano()
		}
	}
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": &ds2}, CheckInBackground: true})
	defer m.Stop()
	m.data["d"].guard.Wait()
	root0 := Caller{}
	want := []StaleCause{{CauseChanged, 1, fixRemap}, {CauseWritable, 2, fixWritable}}
	for _, tt := range []struct {
		backend string
		want    []StaleCause
	}{{"gds", want}, {"bam", want}, {"file", nil}} {
		o, err := m.Open(context.Background(), root0, OpenParams{Dataset: "d", Request: loader.Request{Backend: tt.backend, ReaderArgs: loader.ReaderArgs{BatchSize: 2, NumShards: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		m.Close(root0, o.ID)
		if !slices.Equal(o.NotRaw, tt.want) {
			t.Errorf("%s: NotRaw %+v, want %+v", tt.backend, o.NotRaw, tt.want)
		}
	}
}

// TestLazyAccessIsCounted: a caller's bitmap of opened samples (a bit a
// sample) is what the sampler budget counts for it; root holds none.
func TestLazyAccessIsCounted(t *testing.T) {
	for _, tt := range []struct {
		samples int
		root    bool
		want    int64
	}{{0, false, 0}, {1, false, 8}, {64, false, 8}, {65, false, 16}, {6400, false, 800}, {1000, true, 0}} {
		ds := &bmap.Map{Samples: make([]bmap.Sample, tt.samples)}
		c := credOf(Caller{UID: 65534, GID: 65534})
		if tt.root {
			c = nil
		}
		if got := lazyAccessBytes(ds, c); got != tt.want {
			t.Errorf("%d samples (root %v): %d bytes, want %d", tt.samples, tt.root, got, tt.want)
		}
		if !tt.root {
			a := newLazyAccess("d", ds, nil, c)
			if a == nil {
				t.Fatalf("no lazy access for uid 65534")
			}
		}
	}
}

// TestLazyAccessSharedByCredentials: a registration's sessions with the
// same uid, gid and groups (in any order) share one sample-by-sample
// verdict; any other credentials, or root, do not; the last session gone,
// it is freed.
func TestLazyAccessSharedByCredentials(t *testing.T) {
	d := &dataset{id: 7, name: "d", m: &bmap.Map{Samples: make([]bmap.Sample, 100)}}
	ranks := Caller{UID: 1000, GID: 100, Groups: []uint32{5, 6}}
	a := d.lazy(ranks)
	for _, tt := range []struct {
		name   string
		c      Caller
		shared bool
	}{
		{"the same credentials", Caller{UID: 1000, GID: 100, Groups: []uint32{5, 6}}, true},
		{"groups in another order", Caller{UID: 1000, GID: 100, Groups: []uint32{6, 5}}, true},
		{"a group dropped", Caller{UID: 1000, GID: 100, Groups: []uint32{5}}, false},
		{"another gid", Caller{UID: 1000, GID: 101, Groups: []uint32{5, 6}}, false},
		{"another uid", Caller{UID: 1001, GID: 100, Groups: []uint32{5, 6}}, false},
		{"nobody", Caller{UID: nobody, GID: nobody}, false},
		{"the TCP principal with the same ids", Caller{UID: 1000, GID: 100, Groups: []uint32{5, 6}, TCP: true}, false},
	} {
		if got := d.lazy(tt.c); (got == a) != tt.shared {
			t.Errorf("%s: shared %v, want %v", tt.name, got == a, tt.shared)
		}
	}
	if d.lazy(Caller{}) != nil || d.access(Caller{}) != nil {
		t.Errorf("root has a lazy access check")
	}
	other := &dataset{id: 8, name: "d", m: d.m} // a reload's registration
	if other.lazy(ranks) == a {
		t.Errorf("a new registration shares the old one's verdicts")
	}
	a = nil
	for gc := 1; ; gc++ { // the cleanup runs after a collection finds it unreachable
		runtime.GC()
		d.shares.mu.Lock()
		n := len(d.shares.m)
		d.shares.mu.Unlock()
		if n == 0 {
			break
		}
		if gc == 100 {
			t.Fatalf("after %d collections, %d shared verdicts of sessions that are gone are still kept", gc, n)
		}
		runtime.Gosched()
	}
}

// TestLazyAccessSharedIsolated: two sessions of nobody share what one
// opened, and what one was refused is refused to the other too; a file
// only uid 4242 may read, read by 4242's session first, is still refused
// to nobody's.
func TestLazyAccessSharedIsolated(t *testing.T) {
	asRoot(t)
	fs := testfs.New(t, testfs.Ext4())
	reachable(fs.Dir)
	for i := range 8 {
		fs.WriteFile(t, fmt.Sprintf("train/c0/%d.jpg", i), bytes.Repeat([]byte{byte('a' + i)}, 5000+i))
	}
	fs.Sync(t)
	ds, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	private := fs.Path("train", "c0", "3.jpg")
	if err := os.Chown(private, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(private, 0o600); err != nil {
		t.Fatal(err)
	}
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}, Logger: slog.New(slog.DiscardHandler)})
	defer m.Stop()
	owner, nobodyC := Caller{UID: 4242, GID: 4242}, Caller{UID: nobody, GID: nobody}
	open := func(c Caller) string {
		t.Helper()
		o, err := m.Open(context.Background(), c, OpenParams{Dataset: "d", Request: loader.Request{Backend: "gds", ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}})
		if err != nil {
			t.Fatalf("open as uid %d: %v", c.UID, err)
		}
		t.Cleanup(func() { m.Close(c, o.ID) })
		return o.ID
	}
	if failed, served := readEpoch(t, m, owner, ds, open(owner)); served != 8 || len(failed) != 0 {
		t.Fatalf("uid 4242: %d served, failed %v; want all 8", served, failed)
	}
	first, second := open(nobodyC), open(nobodyC)
	for _, id := range []string{first, second} {
		failed, served := readEpoch(t, m, nobodyC, ds, id)
		if served != 7 || len(failed) != 1 || !strings.Contains(failed["c0/3.jpg"], "permission denied") {
			t.Fatalf("nobody's session %s: %d served, failed %v; want 7, c0/3.jpg refused", id, served, failed)
		}
	}
	d, err := m.acquire("d")
	if err != nil {
		t.Fatal(err)
	}
	defer m.release(d)
	a := d.lazy(nobodyC)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range ds.Samples {
		if ok := a.ok[i/64]&(1<<(i%64)) != 0; ok != (ds.Samples[i].Path != "c0/3.jpg") {
			t.Errorf("nobody's shared verdict on %s: %v", ds.Samples[i].Path, ok)
		}
	}
}

// TestLazyAccessSharedClearDuringOpens: session A of nobody has opened x
// and is still opening, outside the lock; x is then made 0600, and
// session B, sharing the verdict, sees the change, clears it and is
// refused x. What A found before the chmod must not be kept when A ends:
// x stays refused.
func TestLazyAccessSharedClearDuringOpens(t *testing.T) {
	asRoot(t)
	fs := testfs.New(t, testfs.Ext4())
	reachable(fs.Dir)
	fs.WriteFile(t, "train/c0/x.jpg", bytes.Repeat([]byte("x"), 4096))
	fs.WriteFile(t, "train/c1/y.jpg", bytes.Repeat([]byte("y"), 4096))
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d := watched(t, m)
	x, y := 0, 1
	if m.Samples[0].Path != "c0/x.jpg" {
		x, y = 1, 0
	}
	nob := Caller{UID: nobody, GID: nobody}
	shared := d.lazy(nob)
	openedX, resume := make(chan struct{}), make(chan struct{})
	shared.open = func(ds *bmap.Map, i int, g *fresh.Guard) error {
		err := openSample(ds, i, g)
		if i == y { // A, between its open of x and the rest
			close(openedX)
			<-resume
		}
		return err
	}
	A := d.access(nob)
	done := make(chan []loader.Refused, 1)
	go func() { done <- A([]int{x, y}) }()
	<-openedX
	if err := os.Chmod(fs.Path("train", "c0", "x.jpg"), 0o600); err != nil {
		t.Fatal(err)
	}
	B := d.access(nob)
	if r := B([]int{x}); len(r) != 1 {
		t.Fatalf("B after the chmod: %d refusals, want x refused", len(r))
	}
	close(resume)
	if r := <-done; len(r) != 0 {
		t.Fatalf("A, whose opens came before the chmod: %v", r)
	}
	if r := B([]int{x}); len(r) != 1 {
		t.Fatalf("x let through after its chmod 0600: A's open from before it was kept")
	}
}

// TestLazyAccessNewSessionRestats: session A of nobody has just opened
// every sample (the re-stat above the root is fresh); root then makes the
// folder above a linked class 0700, which no watch sees. Session B of
// nobody, opened right after, shares A's verdict yet is refused the
// linked class at its first batch: a session's first batch re-stats.
func TestLazyAccessNewSessionRestats(t *testing.T) {
	asRoot(t)
	fs := testfs.New(t, testfs.Ext4())
	reachable(fs.Dir)
	for i := range 4 {
		fs.WriteFile(t, fmt.Sprintf("train/c0/%d.jpg", i), bytes.Repeat([]byte("a"), 4096+i))
		fs.WriteFile(t, fmt.Sprintf("outside/c1/%d.jpg", i), bytes.Repeat([]byte("b"), 4096+i))
	}
	if err := os.Symlink(fs.Path("outside", "c1"), fs.Path("train", "c1")); err != nil {
		t.Fatal(err)
	}
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Samples) != 8 {
		t.Fatalf("%d samples mapped, want 8", len(m.Samples))
	}
	d := watched(t, m)
	all := allSamples(m)
	nob := Caller{UID: nobody, GID: nobody}
	A := d.access(nob)
	if r := A(all); len(r) != 0 {
		t.Fatalf("A: %d refused before the chmod", len(r))
	}
	d.lazy(nob).ancStat = time.Hour // no re-stat on time: only the new session's
	if err := os.Chmod(fs.Path("outside"), 0o700); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(fs.Path("outside"), 0o755)
	if r := A(all); len(r) != 0 {
		t.Fatalf("A, within its re-stat interval: %d refused (the test's premise)", len(r))
	}
	B := d.access(nob)
	if r := B(all); len(r) != 4 {
		t.Errorf("B's first batch right after the chmod: %d refused, want c1's 4", len(r))
	}
}

// classOpens counts the opens of c's shared verdict on d, which it
// re-stats above the root only hourly. The function it returns gives,
// since its last call, how many times the samples whose paths start with
// prefix were opened, and whether each needs a check after its raw read.
func classOpens(d *dataset, c Caller, prefix string) func() (opens int, needStat bool) {
	var mu sync.Mutex
	opened := map[int]int{}
	shared := d.lazy(c)
	shared.ancStat = time.Hour
	shared.open = func(ds *bmap.Map, i int, g *fresh.Guard) error {
		mu.Lock()
		opened[i]++
		mu.Unlock()
		return openSample(ds, i, g)
	}
	return func() (opens int, needStat bool) {
		mu.Lock()
		defer mu.Unlock()
		needStat = true
		for i, s := range d.m.Samples {
			if strings.HasPrefix(s.Path, prefix) {
				opens += opened[i]
				needStat = needStat && d.guard.NeedStat(i)
			}
		}
		clear(opened)
		return opens, needStat
	}
}

// TestLazyAccessSharedMountHidden: nobody's session A has opened every
// sample; root then mounts a tmpfs over class c0, of which no inotify
// event tells. A new session B's first batch, sharing A's verdict, opens
// c0's samples again and finds them gone: their raw reads are then
// checked as the caller (NeedStat) and fail. A's next batch keeps B's
// verdict. After the unmount a new session C opens them again. The
// ancestors' re-stat plays no part.
func TestLazyAccessSharedMountHidden(t *testing.T) {
	asRoot(t)
	fs, m := classFolders(t, 2)
	d := watched(t, m)
	all := allSamples(m)
	nob := Caller{UID: nobody, GID: nobody}
	A := d.access(nob)
	c0 := classOpens(d, nob, "c0/")
	if r := A(all); len(r) != 0 {
		t.Fatalf("A: %d refused", len(r))
	}
	if n, stat := c0(); n != 4 || stat {
		t.Fatalf("A's first batch: c0's samples opened %d times, NeedStat %v; want 4, false", n, stat)
	}
	hidden := fs.Path("train", "c0")
	if err := unix.Mount("tmpfs", hidden, "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("mount: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(hidden, unix.MNT_DETACH)
		}
	}()
	if r := d.access(nob)(all); len(r) != 0 {
		t.Errorf("B after the mount over c0: %d refused, want none (a path leading nowhere is not a refusal)", len(r))
	}
	if n, stat := c0(); n != 4 || !stat {
		t.Errorf("B after the mount over c0: c0's samples opened %d times, NeedStat %v; want 4, true", n, stat)
	}
	A(all)
	if n, _ := c0(); n != 0 {
		t.Errorf("A's next batch: c0's samples opened %d times again, want 0: B's verdict is A's", n)
	}
	if err := unix.Unmount(hidden, 0); err != nil {
		t.Fatalf("unmount: %v", err)
	}
	mounted = false
	if r := d.access(nob)(all); len(r) != 0 {
		t.Errorf("C after the unmount: %d refused", len(r))
	}
	if n, _ := c0(); n != 4 {
		t.Errorf("C after the unmount: c0's samples opened %d times, want 4", n)
	}
}
