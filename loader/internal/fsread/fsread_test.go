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
	b, err := New(m, 2, false, backend.Env{Cred: &backend.Cred{UID: 65534, GID: 65534}})
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

// TestReadTensorData: a tensor sample is its file's bytes [Offset,
// Offset+Size), read to Buf[At:]. With O_DIRECT and a room at the data's
// phase the whole blocks are read in place (the header's bytes land in
// the slack before At); a dense row at an unaligned address is read with
// a plain pread of exactly its bytes, nothing written around it. A file
// that grew or shrank fails with ErrShortRead naming it and its sizes.
func TestReadTensorData(t *testing.T) {
	const off, size = 300, 5000
	file := make([]byte, off+size)
	for i := range file {
		file[i] = byte(i*7 + i>>8)
	}
	mem, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for _, tc := range []struct {
		name          string
		direct        bool
		bufAt, room   int64 // Buf is mem[bufAt:bufAt+room]
		at            int64
		headerInSlack bool // the read brought the header's bytes into Buf[:At]
	}{
		{"direct, a room at the data's phase", true, 0, 8192, off, true},
		{"buffered, a room at the data's phase", false, 0, 8192, off, false},
		{"direct, a dense row at an unaligned address", true, 4096 + 7, size, 0, false},
		{"direct, a room at another phase", true, 0, 8192, 0, false},
		{"direct, a room too small for whole blocks", true, 0, off + size, off, false},
	} {
		for _, change := range []string{"", "grown", "shrunk"} {
			t.Run(tc.name+"/"+change, func(t *testing.T) {
				root := t.TempDir()
				p := filepath.Join(root, "t.npy")
				if err := os.WriteFile(p, file, 0o644); err != nil {
					t.Fatal(err)
				}
				var st unix.Stat_t
				unix.Stat(p, &st)
				m := &bmap.Map{Version: bmap.Version, Root: root, Reader: bmap.ReaderNumpy,
					Samples: []bmap.Sample{{Path: "t.npy", Offset: off, Size: size, Inode: st.Ino, Reason: bmap.UnknownPlace}}}
				switch change {
				case "grown":
					os.WriteFile(p, append(file, "more"...), 0o644)
				case "shrunk":
					os.Truncate(p, off+size-1)
				}
				for i := range mem {
					mem[i] = 0xEE
				}
				r, err := samplefile.NewReader(m, tc.direct)
				if err != nil {
					t.Fatal(err)
				}
				req := backend.Request{Sample: &m.Samples[0], Buf: mem[tc.bufAt : tc.bufAt+tc.room : tc.bufAt+tc.room], At: tc.at}
				err = r.Read(&req, nil)
				if change != "" {
					var se *backend.SampleError
					if !errors.Is(err, backend.ErrShortRead) || !errors.As(err, &se) || se.Path != "t.npy" || !strings.Contains(err.Error(), "the map says 5300") {
						t.Fatalf("Read of a %s file: %v, want ErrShortRead naming t.npy and the mapped size", change, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got := req.Data(); string(got) != string(file[off:]) {
					t.Fatalf("the data read differs from the file's bytes [%d, %d)", off, off+size)
				}
				slack := req.Buf[:tc.at]
				if tc.headerInSlack != (tc.at > 0 && string(slack) == string(file[off-tc.at:off])) {
					t.Errorf("the slack before the data holds the header: %v, want %v", !tc.headerInSlack, tc.headerInSlack)
				}
				for i := range mem[:tc.bufAt] {
					if mem[i] != 0xEE {
						t.Fatalf("byte %d before the request's room written", i)
					}
				}
				if end := tc.bufAt + tc.room; mem[end] != 0xEE {
					t.Fatalf("the byte after the request's room written")
				}
			})
		}
	}
}
