// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// mountIDAt returns the mount ID at p (statx STATX_MNT_ID).
func mountIDAt(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mnt_id
}

// TestWatcherMountReplacedSameID: class a is itself a mount (a bind
// mount, as a dataset assembled from several disks has) when the watch
// starts. Root unmounts it and mounts a tmpfs there. The kernel hands
// the freed mount ID (lowest free first) to the new mount, so the kept
// (ID, mount point) pair in the table is the same; ChangedSince must
// still mark all (a flagged look with a mount kept is a change, and the
// point's stat gives the mount's unique ID).
func TestWatcherMountReplacedSameID(t *testing.T) {
	root, elsewhere := mountRoot(t, "a", "b"), t.TempDir()
	a := filepath.Join(root, "a")
	os.WriteFile(filepath.Join(elsewhere, "0.jpg"), []byte("x"), 0o644)
	if err := unix.Mount(elsewhere, a, "", unix.MS_BIND, ""); err != nil {
		testenv.SkipPrivileged(t, "bind mount: %v", err)
	}
	mounted := true
	defer func() {
		if mounted {
			unix.Unmount(a, unix.MNT_DETACH)
		}
	}()
	w, err := NewWatcher(root, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Poll()
	before := mountIDAt(t, a)
	e := w.Events()
	if err := unix.Unmount(a, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", a, "tmpfs", 0, "size=1m"); err != nil {
		mounted = false
		t.Fatal(err)
	}
	after := mountIDAt(t, a)
	w.Poll()
	if _, all := w.ChangedSince(e); !all {
		t.Errorf("class a's bind mount (ID %d) replaced by a tmpfs (ID %d): ChangedSince does not mark all", before, after)
	}
}

// TestWatcherMountKinds: kinds of mount that change what a path under
// the root (or under a symlink's target) leads to, each of which must
// mark all once seen, and so must their unmount.
func TestWatcherMountKinds(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "mounting needs root")
	}
	run := func(t *testing.T, name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, root, target, elsewhere string) (undo func())
	}{
		{"a file bind-mounted over a sample", func(t *testing.T, root, _, elsewhere string) func() {
			p := filepath.Join(root, "a", "0.jpg")
			run(t, "mount", "--bind", filepath.Join(elsewhere, "f"), p)
			return func() { unix.Unmount(p, unix.MNT_DETACH) }
		}},
		{"a tmpfs over a folder beneath a symlink's target", func(t *testing.T, _, target, _ string) func() {
			p := filepath.Join(target, "sub")
			run(t, "mount", "-t", "tmpfs", "tmpfs", p)
			return func() { unix.Unmount(p, unix.MNT_DETACH) }
		}},
		{"a file bind-mounted over a symlink's target", func(t *testing.T, _, target, elsewhere string) func() {
			p := filepath.Join(target, "sub", "t.jpg")
			run(t, "mount", "--bind", filepath.Join(elsewhere, "f"), p)
			return func() { unix.Unmount(p, unix.MNT_DETACH) }
		}},
		{"mount --move from elsewhere into the root", func(t *testing.T, root, _, elsewhere string) func() {
			src := filepath.Join(elsewhere, "m")
			run(t, "mount", "-t", "tmpfs", "tmpfs", src)
			p := filepath.Join(root, "a")
			run(t, "mount", "--move", src, p)
			return func() { unix.Unmount(p, unix.MNT_DETACH) }
		}},
		{"a mount propagated from another namespace", func(t *testing.T, root, _, _ string) func() {
			p := filepath.Join(root, "a")
			run(t, "unshare", "-m", "--propagation", "unchanged", "mount", "-t", "tmpfs", "tmpfs", p)
			return func() { unix.Unmount(p, unix.MNT_DETACH) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, elsewhere, target := t.TempDir(), t.TempDir(), t.TempDir()
			// A shared mount of its own, so that another namespace's mount propagates.
			run(t, "mount", "--bind", base, base)
			run(t, "mount", "--make-shared", base)
			defer unix.Unmount(base, unix.MNT_DETACH)
			root := filepath.Join(base, "root")
			for _, d := range []string{filepath.Join(root, "a"), filepath.Join(target, "sub"), filepath.Join(elsewhere, "m")} {
				os.MkdirAll(d, 0o755)
			}
			os.WriteFile(filepath.Join(root, "a", "0.jpg"), []byte("x"), 0o644)
			os.WriteFile(filepath.Join(target, "sub", "t.jpg"), []byte("x"), 0o644)
			os.WriteFile(filepath.Join(elsewhere, "f"), []byte("y"), 0o644)
			os.Symlink(target, filepath.Join(root, "l"))
			w, err := NewWatcher(root, []string{"a", "l"})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			w.watchMountsBeneath([]string{filepath.Join(root, "l")})
			w.Poll()
			e := w.Events()
			undo := tc.change(t, root, target, elsewhere)
			w.Poll()
			if _, all := w.ChangedSince(e); !all {
				t.Errorf("the mount: ChangedSince does not mark all")
			}
			e = w.Events()
			undo()
			w.Poll()
			if _, all := w.ChangedSince(e); !all {
				t.Errorf("the unmount (MNT_DETACH): ChangedSince does not mark all")
			}
		})
	}
}

// TestMountTableStackedSettles: with two mounts stacked at one point
// (the lower one's stat never leads to it), a look with nothing changed
// reads no table: changed is false at every look, not a re-read each.
func TestMountTableStackedSettles(t *testing.T) {
	root := mountRoot(t, "a")
	a := filepath.Join(root, "a")
	for range 2 {
		if err := unix.Mount("tmpfs", a, "tmpfs", 0, "size=1m"); err != nil {
			testenv.SkipPrivileged(t, "mount tmpfs: %v", err)
		}
		defer unix.Unmount(a, unix.MNT_DETACH)
	}
	mt, err := openMountTable(root)
	if err != nil {
		t.Fatal(err)
	}
	defer mt.close()
	if len(mt.points) != 2 {
		t.Fatalf("%d mounts kept, want 2: %v", len(mt.points), mt.points)
	}
	for i := range 100 {
		if mt.changed() {
			t.Fatalf("look %d: changed with nothing changed", i)
		}
	}
}

// TestWatcherMountOddRoot: a root whose name has a space, a tab, a
// newline and a backslash (all escaped in mountinfo) still tells a mount
// beneath it.
func TestWatcherMountOddRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "mounting needs root")
	}
	root := filepath.Join(t.TempDir(), "a b\tc\nd\\e")
	a := filepath.Join(root, "x y")
	if err := os.MkdirAll(a, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(root, []string{"x y"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Poll()
	e := w.Events()
	if err := unix.Mount("tmpfs", a, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(a, unix.MNT_DETACH)
	w.Poll()
	if _, all := w.ChangedSince(e); !all {
		t.Error("a mount beneath an oddly named root: ChangedSince does not mark all")
	}
}
