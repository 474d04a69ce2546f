package session

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
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
