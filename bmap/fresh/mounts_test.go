// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// TestMountsBeneath: only mount points at or beneath a folder count, a
// sibling with the same prefix does not, escapes are undone, and a line
// that is not mountinfo's is an error naming its line.
func TestMountsBeneath(t *testing.T) {
	table, err := os.ReadFile("testdata/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		dirs []string
		want []mountPoint
	}{
		{"the root and beneath", []string{"/data/train"}, []mountPoint{{62, "/data/train/c0"}, {64, "/data/train/with space"}, {65, "/data/train"}}},
		{"a trailing slash", []string{"/data/train/"}, []mountPoint{{62, "/data/train/c0"}, {64, "/data/train/with space"}, {65, "/data/train"}}},
		{"one class", []string{"/data/train/c0"}, []mountPoint{{62, "/data/train/c0"}}},
		{"two folders", []string{"/sys", "/data/train2"}, []mountPoint{{22, "/sys"}, {63, "/data/train2"}}},
		{"none beneath", []string{"/data/train/c1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mountsBeneath(table, tc.dirs)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("mountsBeneath(%v) = %v, %v; want %v", tc.dirs, got, err, tc.want)
			}
		})
	}
	for _, bad := range []struct{ table, want string }{
		{"22 28 0:21 /\n", "line 1: 4 fields"},
		{"28 1 254:1 / / rw\nx 28 0:21 / /sys rw\n", "line 2: mount ID"},
		{`28 1 254:1 / /a\04 rw`, "three octal digits"},
		{`28 1 254:1 / /a\9zz rw`, "three octal digits"},
	} {
		if _, err := mountsBeneath([]byte(bad.table), []string{"/"}); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("mountsBeneath(%q) = %v; want an error with %q", bad.table, err, bad.want)
		}
	}
}

// FuzzMountsBeneath: no table makes mountsBeneath panic, and what it
// keeps are points beneath the folder.
func FuzzMountsBeneath(f *testing.F) {
	if b, err := os.ReadFile("testdata/mountinfo"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`1 2 3:4 / /d/x\134y rw`))
	f.Fuzz(func(t *testing.T, table []byte) {
		got, err := mountsBeneath(table, []string{"/data/train"})
		if err != nil && got != nil {
			t.Fatalf("kept %v with the error %v", got, err)
		}
		for _, p := range got {
			if !beneath(p.at, "/data/train") {
				t.Fatalf("kept %v", p)
			}
		}
	})
}

// TestWatcherMount: a mount over a class folder, and its unmount, are
// each a change to everything at that point, once; a mount outside the
// root is none while no mount is kept beneath it.
func TestWatcherMount(t *testing.T) {
	root, elsewhere := mountRoot(t, "a", "b"), t.TempDir()
	w, err := NewWatcher(root, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mount := func(at string) func() {
		t.Helper()
		if err := unix.Mount("tmpfs", at, "tmpfs", 0, "size=1m"); err != nil {
			testenv.SkipPrivileged(t, "mount tmpfs: %v", err)
		}
		return func() {
			t.Helper()
			if err := unix.Unmount(at, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	w.Poll()
	before := func(what string, change func(), want bool) {
		t.Helper()
		e, g := w.Events(), w.Generation()
		change()
		w.Poll()
		if _, all := w.ChangedSince(e); all != want {
			t.Errorf("%s: ChangedSince marks all = %v, want %v", what, all, want)
		}
		if moved := w.Generation() != g; moved != want {
			t.Errorf("%s: the generation moved = %v, want %v", what, moved, want)
		}
		e = w.Events()
		w.Poll()
		if _, all := w.ChangedSince(e); all {
			t.Errorf("%s: ChangedSince still marks all at the next poll", what)
		}
	}
	var unmountElsewhere, unmountA func()
	before("a mount outside the root", func() { unmountElsewhere = mount(elsewhere) }, false)
	before("a mount over class a", func() { unmountA = mount(filepath.Join(root, "a")) }, true)
	// With a mount kept beneath the root, any flagged look is a change:
	// the kernel reuses mount IDs, so the table cannot tell a mount
	// replaced at the same point.
	before("an unmount outside the root, class a mounted", func() { unmountElsewhere() }, true)
	before("the unmount of class a", func() { unmountA() }, true)
	before("a mount outside the root, none beneath", func() { unmountElsewhere = mount(elsewhere) }, false)
	unmountElsewhere()
	if w.Changed(0) || w.Changed(1) {
		t.Error("a mount made Changed true for good")
	}
}

// mountRoot returns a new folder holding the folders classes, for a test
// that mounts; it skips the test without root.
func mountRoot(t *testing.T, classes ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "mounting needs root")
	}
	root := t.TempDir()
	for _, c := range classes {
		if err := os.Mkdir(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestMountTableUnflaggedUnmount: an unmount the kernel did not flag
// (older kernels skip the flag when no other mount came between) is
// still seen, by the mount ID at the mount point.
func TestMountTableUnflaggedUnmount(t *testing.T) {
	root := mountRoot(t, "a")
	at := filepath.Join(root, "a")
	mt, err := openMountTable(root)
	if err != nil {
		t.Fatal(err)
	}
	defer mt.close()
	if err := unix.Mount("tmpfs", at, "tmpfs", 0, "size=1m"); err != nil {
		testenv.SkipPrivileged(t, "mount tmpfs: %v", err)
	}
	if !mt.changed() || mt.changed() {
		t.Fatal("the mount was not seen once")
	}
	if err := unix.Unmount(at, 0); err != nil {
		t.Fatal(err)
	}
	unix.Poll([]unix.PollFd{{Fd: int32(mt.fd), Events: unix.POLLPRI}}, 0) // takes the flag, if any
	if !mt.changed() {
		t.Error("an unflagged unmount was not seen")
	}
}

// BenchmarkMountTableChanged: what a look at the mount table costs each
// Guard.Poll (a batch), with no mount beneath the root.
func BenchmarkMountTableChanged(b *testing.B) {
	mt, err := openMountTable(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer mt.close()
	for b.Loop() {
		mt.changed()
	}
}
