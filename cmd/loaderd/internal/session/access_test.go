package session

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/extentinfo"
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
		m.Samples = append(m.Samples, bmap.Sample{Path: p, Label: int32(i), Size: 4})
	}
	return m
}

func TestCheckAccess(t *testing.T) {
	owner := os.Getuid() // the owner cases need an owner that is not root
	if owner == 0 {
		owner = 54320
	}
	own := func(r string, mode os.FileMode) {
		os.Chown(filepath.Join(r, "b/x.jpg"), owner, -1)
		os.Chmod(filepath.Join(r, "b/x.jpg"), mode)
	}
	me := os.Getuid()
	other := identity{uid: 54321, gids: []uint32{54321}}
	type accessCase struct {
		name  string
		setup func(root string)
		id    identity
		want  string // "" allowed, else the refusal mentions it
	}
	tests := []accessCase{
		{"readable by all", func(string) {}, other, ""},
		{"a file of mode 0600", func(r string) { os.Chmod(filepath.Join(r, "b/x.jpg"), 0o600) }, other, "b/x.jpg: no read permission"},
		{"a class directory others cannot search", func(r string) { os.Chmod(filepath.Join(r, "a"), 0o754) }, other, "/a: no search permission"},
		{"a missing file", func(r string) { os.Remove(filepath.Join(r, "a/x.jpg")) }, other, "a/x.jpg: no such file"},
		{"the owner's own 0600 file", func(r string) { own(r, 0o600) }, identity{uid: owner}, ""},
		{"the owner class decides for the owner", func(r string) { own(r, 0o044) }, identity{uid: owner}, "b/x.jpg: no read permission"},
		{"root reads everything", func(r string) { os.Chmod(filepath.Join(r, "b/x.jpg"), 0o000) }, identity{uid: 0}, ""},
		{"unknown uid (TCP): the other class", func(r string) { os.Chmod(filepath.Join(r, "b/x.jpg"), 0o640) }, identity{uid: -1}, "b/x.jpg: no read permission"},
	}
	if me != 0 {
		t.Logf("not root: the group cases (chown to another group) are skipped")
	} else {
		group := func(mode os.FileMode) func(string) {
			return func(r string) {
				os.Chown(filepath.Join(r, "b/x.jpg"), 0, 4242)
				os.Chmod(filepath.Join(r, "b/x.jpg"), mode)
			}
		}
		tests = append(tests,
			accessCase{"a member of the file's group", group(0o640), identity{uid: 54321, gids: []uint32{7, 4242}}, ""},
			accessCase{"the group class decides for members", group(0o604), identity{uid: 54321, gids: []uint32{4242}}, "b/x.jpg: no read permission"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tree(t)
			tt.setup(m.Root)
			err := checkAccess(m, tt.id)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want a refusal mentioning %q", err, tt.want)
			}
		})
	}
}

func TestCheckAncestors(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "x", "train")
	os.MkdirAll(root, 0o755)
	os.Chmod(base, 0o755)
	os.Chmod(filepath.Dir(base), 0o755) // t.TempDir's parent, ours too
	for d := filepath.Dir(base); d != "/"; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm()&0o001 == 0 {
			t.Skipf("%s is not searchable by others here: cannot test from a clean ancestry", d)
		}
	}
	other := identity{uid: 54321}
	if err := checkAncestors(root, other); err != nil {
		t.Fatalf("searchable ancestry refused: %v", err)
	}
	os.Chmod(filepath.Join(base, "x"), 0o750)
	if err := checkAncestors(root, other); err == nil || !strings.Contains(err.Error(), filepath.Join(base, "x")+": no search permission") {
		t.Errorf("err = %v, want the unsearchable parent named", err)
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
	os.Chmod(ds.Root, 0o755)
	os.Chmod(filepath.Dir(ds.Root), 0o755) // t.TempDir's parent, ours too
	if err := checkAncestors(ds.Root, identity{uid: 1001}); err != nil {
		t.Skipf("the test tree's ancestry is not searchable by others here: %v", err)
	}
	m := NewManager(Config{Datasets: map[string]*bmap.Map{"d": ds}})
	defer m.Stop()
	if m.data.guard("d") == nil {
		t.Fatalf("dataset not registered: no verdict cache to test")
	}
	slow, fast := Caller{UID: 1001, GID: 1001}, Caller{UID: 1002, GID: 1002}
	release := make(chan struct{})
	var calls sync.Map // uid -> *atomic.Int32
	m.access.check = func(_ *bmap.Map, id identity) error {
		n, _ := calls.LoadOrStore(id.uid, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		if id.uid == slow.UID {
			<-release
			return errors.New("b/x.jpg: no read permission")
		}
		return nil
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
		go func() { errs <- m.authorize("d", ds, slow) }()
	}
	for deadline := time.Now().Add(10 * time.Second); count(slow.UID) == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the access check never ran")
		}
	}
	done := make(chan error, 1)
	go func() { done <- m.authorize("d", ds, fast) }()
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
	if err := m.authorize("d", ds, slow); !errors.Is(err, ErrForbidden) {
		t.Errorf("cached verdict: err = %v", err)
	}
	if n := count(slow.UID); n != 1 {
		t.Errorf("a cached verdict was checked again (%d checks)", n)
	}
}
