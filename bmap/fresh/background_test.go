// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// TestPendingIsNeverRaw: until the checking pass has judged a raw sample,
// it is Writable (read through the filesystem as the caller) and not
// RawAllowed, whatever else is known of it; once judged, its verdict
// rules.
func TestPendingIsNeverRaw(t *testing.T) {
	g := &Guard{checked: newBitset(3), writable: newBitset(3), staleOpen: newBitset(3)}
	g.writable.set(1)
	for i := range 3 {
		if !g.Writable(i) || g.RawAllowed(i) {
			t.Errorf("sample %d, not judged: Writable %v, RawAllowed %v; want true, false", i, g.Writable(i), g.RawAllowed(i))
		}
	}
	for i := range 3 {
		g.checked.set(i)
	}
	if g.Writable(0) || !g.RawAllowed(0) || !g.Writable(1) || g.RawAllowed(1) {
		t.Errorf("judged: sample 0 Writable %v RawAllowed %v, sample 1 Writable %v RawAllowed %v", g.Writable(0), g.RawAllowed(0), g.Writable(1), g.RawAllowed(1))
	}
}

// TestBackgroundPass: with Options.Background, OpenWith returns before
// the pass ends; meanwhile no verdict is reused (the generation moves at
// every call) and a change made to an already-judged sample through a
// hard link made outside the dataset after its check (which no inotify
// watch sees, and whose link did not exist when it was judged) still
// reaches it: the fanotify index records each sample before checking it.
// Once the pass is over, every sample is judged, the generation holds
// still, and the changed samples are not read raw unchecked.
func TestBackgroundPass(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	const n = 6000
	body := make([]byte, 1024)
	for i := range n {
		body[0], body[1] = byte(i), byte(i>>8)
		fs.WriteFile(t, fmt.Sprintf("train/c%d/%05d.jpg", i%8, i), body)
	}
	must(t, os.MkdirAll(fs.Path("outside"), 0o755))
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checked := make(chan Counts, 1)
	g, err := OpenWith(m, Options{Method: Watch, Background: true, OnChecked: func(g *Guard) { checked <- g.Counts() }})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	during := g.Checked()
	g0, g1 := g.Generation(), g.Generation()
	if !during && g0 == g1 && !g.Checked() {
		t.Errorf("the generation held still (%d) during the checking pass", g0)
	}
	// The first sample judged: link it from outside and chmod it there.
	target := 0
	for deadline := time.Now().Add(10 * time.Second); !g.checked.has(target); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pass did not reach sample 0")
		}
	}
	midPass := !g.Checked()
	link := fs.Path("outside", "z")
	must(t, os.Link(fs.Path("train", m.Samples[target].Path), link))
	must(t, os.Chmod(link, 0o600))
	g.Wait()
	if !midPass {
		t.Logf("the pass ended before the change: the change was made after it")
	}
	c := <-checked
	if c.Pending != 0 {
		t.Errorf("OnChecked saw %d samples pending", c.Pending)
	}
	g.Poll()
	if g.RawAllowed(target) && !g.NeedStat(target) {
		t.Errorf("sample %d, chmod'ed through an outside link after its check: read raw without a check", target)
	}
	a, b := g.Generation(), g.Generation()
	if a != b {
		t.Errorf("the generation moves after the pass: %d, %d", a, b)
	}
	if a == g1 {
		t.Errorf("the generation after the pass (%d) is one judged during it", a)
	}
	if got := g.Counts(); got.Pending != 0 || got.Stale != 1 || got.Fresh != n-1 {
		t.Errorf("counts after the pass: %+v, want %d fresh, 1 stale", got, n-1)
	}
}
