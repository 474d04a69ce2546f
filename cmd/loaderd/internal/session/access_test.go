// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/cred"
	"github.com/nvfeed/nvfeed/internal/testenv"
)

// tree makes root/{a,b}/x.jpg and its map, all 0755 dirs and 0644 files.
func tree(t *testing.T) *bmap.Map {
	root := t.TempDir()
	m := &bmap.Map{Root: root, Classes: []string{"a", "b"}}
	for i, c := range m.Classes {
		os.Mkdir(filepath.Join(root, c), 0o755)
		p := filepath.Join(c, "x.jpg")
		if err := os.WriteFile(filepath.Join(root, p), []byte("jpeg"), 0o644); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, p), &st); err != nil {
			t.Fatal(err)
		}
		m.Samples = append(m.Samples, bmap.Sample{Path: p, Label: int32(i), Size: 4, Inode: st.Ino})
	}
	return m
}

// asRoot skips (or, in CI, fails) a test that switches credentials.
func asRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "session: judging as another user needs root (euid %d)", os.Geteuid())
	}
}

// reachable makes dir and every directory above it, up to the system's
// temporary directory, searchable by others (0755).
func reachable(dir string) {
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

// searchable makes t.TempDir's parent (0700) searchable by others.
func searchable(t *testing.T, root string) {
	t.Helper()
	for _, d := range []string{root, filepath.Dir(root)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCheckAccess judges as the kernel does, as an attacker would probe
// it: real uids, groups from the caller's connection (not the user
// database), symlinks into places the caller cannot reach, ACLs.
func TestCheckAccess(t *testing.T) {
	asRoot(t)
	nobodyC := Caller{UID: nobody, GID: nobody}
	file := func(r string) string { return filepath.Join(r, "b/x.jpg") }
	// hide moves what rel names into a 0700 directory beside the root and
	// leaves a symlink to it in its place.
	hide := func(rel string) func(string) {
		return func(r string) {
			vault := filepath.Join(filepath.Dir(r), "vault")
			os.Mkdir(vault, 0o700)
			dst := filepath.Join(vault, filepath.Base(rel))
			if err := os.Rename(filepath.Join(r, rel), dst); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(dst, filepath.Join(r, rel)); err != nil {
				t.Fatal(err)
			}
		}
	}
	group := func(gid int, mode os.FileMode) func(string) {
		return func(r string) {
			os.Chown(file(r), 0, gid)
			os.Chmod(file(r), mode)
		}
	}
	pg, pgErr := user.Lookup("postgres") // a member of ssl-cert in /etc/group on Debian
	type accessCase struct {
		name  string
		setup func(root string)
		c     Caller
		want  string // "" allowed, else the refusal mentions it
	}
	tests := []accessCase{
		{"readable by all", func(string) {}, nobodyC, ""},
		{"a file of mode 0600", func(r string) { os.Chmod(file(r), 0o600) }, nobodyC, "b/x.jpg: permission denied"},
		{"a class directory others cannot search", func(r string) { os.Chmod(filepath.Join(r, "a"), 0o754) }, nobodyC, "a/x.jpg: permission denied"},
		{"a missing file is a failed sample, not a refusal", func(r string) { os.Remove(filepath.Join(r, "a/x.jpg")) }, nobodyC, ""},
		{"a sample symlinked into a 0700 directory", hide("b/x.jpg"), nobodyC, "b/x.jpg: permission denied"},
		{"a class directory symlinked into a 0700 directory", hide("b"), nobodyC, "b/…: permission denied"}, // b leads where nobody may not list: x.jpg is not named
		{"the owner's own 0600 file", func(r string) { os.Chown(file(r), 54320, -1); os.Chmod(file(r), 0o600) }, Caller{UID: 54320, GID: 54320}, ""},
		{"the owner class decides for the owner", func(r string) { os.Chown(file(r), 54320, -1); os.Chmod(file(r), 0o044) }, Caller{UID: 54320, GID: 54320}, "b/x.jpg: permission denied"},
		{"a group the caller's process has", group(4242, 0o640), Caller{UID: nobody, GID: nobody, Groups: []uint32{7, 4242}}, ""},
		{"a group the caller's process does not have", group(4242, 0o640), nobodyC, "b/x.jpg: permission denied"},
		{"the group class decides for members", group(4242, 0o604), Caller{UID: nobody, GID: nobody, Groups: []uint32{4242}}, "b/x.jpg: permission denied"},
		{"root reads everything", func(r string) { os.Chmod(file(r), 0o000) }, Caller{UID: 0, GID: 0}, ""},
		{"unknown uid (TCP) is judged as nobody", func(r string) { os.Chmod(file(r), 0o640) }, Caller{UID: -1, GID: -1}, "b/x.jpg: permission denied"},
	}
	if pgErr == nil {
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		tests = append(tests, accessCase{"a group the user database lists but the process dropped",
			group(103, 0o640), Caller{UID: uid, GID: gid}, "b/x.jpg: permission denied"})
	}
	if _, err := exec.LookPath("setfacl"); err == nil {
		tests = append(tests, accessCase{"an ACL entry that excludes the caller", func(r string) {
			if out, err := exec.Command("setfacl", "-m", "u:nobody:---", file(r)).CombinedOutput(); err != nil {
				t.Skipf("setfacl: %v: %s", err, out)
			}
		}, nobodyC, "b/x.jpg: permission denied"})
	} else {
		testenv.SkipPrivileged(t, "setfacl missing (apt install acl): the ACL case cannot run")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tree(t)
			searchable(t, m.Root)
			tt.setup(m.Root)
			err := checkAccess(m, credOf(tt.c), nil)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want a refusal mentioning %q", err, tt.want)
			}
		})
	}
}

// TestCheckAccessRoot: the root of the dataset and every directory above
// it must be searchable by the caller, symlinks included.
func TestCheckAccessRoot(t *testing.T) {
	asRoot(t)
	m := tree(t)
	searchable(t, m.Root)
	base := filepath.Dir(m.Root)
	vault := filepath.Join(base, "vault")
	os.Mkdir(vault, 0o700)
	os.Rename(m.Root, filepath.Join(vault, "ds"))
	os.Symlink(filepath.Join(vault, "ds"), m.Root)
	if err := checkAccess(m, credOf(Caller{UID: nobody, GID: nobody}), nil); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a root symlinked into a 0700 directory: err = %v, want permission denied", err)
	}
	os.Chmod(vault, 0o755)
	if err := checkAccess(m, credOf(Caller{UID: nobody, GID: nobody}), nil); err != nil {
		t.Errorf("the same tree made searchable: %v", err)
	}
	os.Chmod(base, 0o750)
	if err := checkAccess(m, credOf(Caller{UID: nobody, GID: nobody}), nil); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a parent of the root that others cannot search: err = %v", err)
	}
}

// TestVerdictConcurrent: concurrent first opens by one caller share one
// access check, and a check that takes long (a stat of every file, seconds
// at ImageNet scale) holds up neither another caller nor its verdict.
func TestVerdictConcurrent(t *testing.T) {
	ds := tree(t)
	dev, err := extentinfo.ResolveDevice(ds.Root)
	if err != nil {
		t.Skipf("cannot resolve the device of %s: %v", ds.Root, err)
	}
	ds.Device = dev
	searchable(t, ds.Root)
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}})
	defer m.Stop()
	d := m.data["d"]
	if d.guard == nil {
		t.Fatalf("dataset not registered: no verdict cache to test")
	}
	slow, fast := Caller{UID: 1001, GID: 1001}, Caller{UID: 1002, GID: 1002}
	release := make(chan struct{})
	var calls sync.Map // uid -> *atomic.Int32
	m.access.check = func(_ context.Context, _ *bmap.Map, _ []int32, c *cred.Cred, _ *fresh.Guard, _ func(int)) (int, error) {
		n, _ := calls.LoadOrStore(int(c.UID), new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if int(c.UID) == slow.UID {
			<-release
			return -1, errors.New("b/x.jpg: no read permission")
		}
		return -1, nil
	}
	count := func(uid int) int32 {
		n, ok := calls.Load(uid)
		if !ok {
			return 0
		}
		return n.(*atomic.Int32).Load()
	}
	const waiters = 4
	errs := make(chan error, waiters)
	for range waiters {
		go func() { errs <- m.authorize(context.Background(), d, slow) }()
	}
	for deadline := time.Now().Add(10 * time.Second); count(slow.UID) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the access check never ran")
		}
	}
	done := make(chan error, 1)
	go func() { done <- m.authorize(context.Background(), d, fast) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("fast caller refused: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("a caller waited for another caller's access check")
	}
	close(release)
	for range waiters {
		if err := <-errs; !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), "b/x.jpg") {
			t.Errorf("slow caller: err = %v, want ErrForbidden naming b/x.jpg", err)
		}
	}
	if n := count(slow.UID); n != 1 {
		t.Errorf("%d concurrent opens by one caller ran %d checks, want 1", waiters, n)
	}
	// Cached now: no new check until the dataset changes.
	if err := m.authorize(context.Background(), d, slow); !errors.Is(err, ErrForbidden) {
		t.Errorf("cached verdict: err = %v", err)
	}
	if n := count(slow.UID); n != 1 {
		t.Errorf("a cached verdict was checked again (%d checks)", n)
	}
}
