// SPDX-License-Identifier: Apache-2.0

package fsread

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/cred"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/samplefile"
)

// dataset makes root/a/{0,1,2}.jpg (0644) and their map entries (inodes
// and sizes; no extents: filesystem-only).
func dataset(t *testing.T) *bmap.Map {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{root, filepath.Dir(root)} {
		os.Chmod(d, 0o755)
	}
	m := &bmap.Map{Version: bmap.Version, Root: root, Classes: []string{"a"}}
	os.Mkdir(filepath.Join(root, "a"), 0o755)
	for _, n := range []string{"0.jpg", "1.jpg", "2.jpg"} {
		p := filepath.Join(root, "a", n)
		if err := os.WriteFile(p, []byte("contents of "+n), 0o644); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		unix.Stat(p, &st)
		m.Samples = append(m.Samples, bmap.Sample{Path: "a/" + n, Size: st.Size, Inode: st.Ino, Reason: bmap.UnknownPlace})
	}
	return m
}

// TestReadBoundToMappedFile: what a path names now is read only if it is
// the file that was mapped; the errors name the sample and why.
func TestReadBoundToMappedFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(root string)
		want   error  // nil: read, equal to the file
		msg    string // in the error
	}{
		{"unchanged", func(string) {}, nil, ""},
		{"rewritten in place, same size", func(r string) { os.WriteFile(filepath.Join(r, "a/1.jpg"), []byte("CONTENTS OF 1.jpg"), 0o644) }, nil, ""},
		{"renamed over", func(r string) {
			os.WriteFile(filepath.Join(r, "a/.new"), []byte("contents of 1.jpg"), 0o644)
			os.Rename(filepath.Join(r, "a/.new"), filepath.Join(r, "a/1.jpg"))
		}, ErrReplaced, "names another file"},
		{"swapped for a symlink to another file", func(r string) {
			os.Remove(filepath.Join(r, "a/1.jpg"))
			os.Symlink(filepath.Join(r, "a/2.jpg"), filepath.Join(r, "a/1.jpg"))
		}, ErrReplaced, "names another file"},
		{"swapped for a directory", func(r string) {
			os.Remove(filepath.Join(r, "a/1.jpg"))
			os.Mkdir(filepath.Join(r, "a/1.jpg"), 0o755)
		}, ErrReplaced, "names another file"},
		{"grown", func(r string) {
			f, _ := os.OpenFile(filepath.Join(r, "a/1.jpg"), os.O_APPEND|os.O_WRONLY, 0)
			f.Write([]byte("+ 5 bytes"))
			f.Close()
		}, backend.ErrShortRead, "the file is 26 bytes now, the map says 17"},
		{"deleted", func(r string) { os.Remove(filepath.Join(r, "a/1.jpg")) }, unix.ENOENT, "open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := dataset(t)
			tc.change(m.Root)
			r, err := samplefile.NewReader(m, false)
			if err != nil {
				t.Fatal(err)
			}
			req := backend.Request{Index: 1, Sample: &m.Samples[1], Buf: make([]byte, 4096)}
			err = r.Read(&req, nil)
			if tc.want == nil {
				want, _ := os.ReadFile(filepath.Join(m.Root, "a/1.jpg"))
				if err != nil || string(req.Buf[:len(want)]) != string(want) {
					t.Fatalf("Read: %v, %q, want %q", err, req.Buf[:len(want)], want)
				}
				return
			}
			var se *backend.SampleError
			if !errors.Is(err, tc.want) || !errors.As(err, &se) || se.Path != "a/1.jpg" || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Read: %v, want a SampleError for a/1.jpg wrapping %v and saying %q", err, tc.want, tc.msg)
			}
		})
	}
}

// TestBackendReadsAsTheCaller: with Env.Cred the workers open as that
// user: a file the user may not read fails with EACCES (root's access is
// not lent), the others are read.
func TestBackendReadsAsTheCaller(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "fsread: reading as another user needs root (euid %d)", os.Geteuid())
	}
	m := dataset(t)
	os.Chmod(filepath.Join(m.Root, "a/1.jpg"), 0o600)
	b, err := New(m, 2, false, backend.Env{Cred: &cred.Cred{UID: 65534, GID: 65534}}, Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	reqs := make([]backend.Request, len(m.Samples))
	for i := range reqs {
		reqs[i] = backend.Request{Index: i, Sample: &m.Samples[i], Buf: make([]byte, 4096)}
	}
	b.ReadBatch(t.Context(), reqs)
	for i, r := range reqs {
		switch {
		case i == 1 && !errors.Is(r.Err, unix.EACCES):
			t.Errorf("the 0600 file read as nobody: %v, want EACCES", r.Err)
		case i != 1 && r.Err != nil:
			t.Errorf("sample %d: %v", i, r.Err)
		}
	}
}
