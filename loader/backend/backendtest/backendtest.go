// SPDX-License-Identifier: Apache-2.0

// Package backendtest is the conformance suite of package backend: Run
// checks what every backend, built-in or registered, promises the
// loader. Its reads equal the file's bytes where the Request puts them
// (Buf[At:], or Dev), in ragged rooms and dense rows; it honours a
// cancelled context; a sample that cannot be read fails as a
// *backend.SampleError, never as empty or stale bytes; with Env.Cred it
// reads as the caller (a file the caller may not read fails); its Stats
// names are snake_case and unique.
package backendtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// Config says how to run the suite over one backend.
type Config struct {
	Spec    backend.Spec   // the backend; Open is called once per subtest
	Options map[string]any // its options (backend.Spec.Resolve); nil: the defaults
	// Dir returns a fresh, empty directory for the suite's datasets; nil:
	// t.TempDir(). A backend that reads the block device gives one on a
	// real filesystem (ext4, xfs). The suite makes it and its parent
	// world-searchable (0755) for the caller subtest.
	Dir func(t *testing.T) string
	// Device is GPU memory for a backend that writes the device itself
	// (Spec.DeviceWrites): its requests carry Dev and DevRoom, no Buf.
	Device *Device
}

// Device is GPU memory the suite's requests point into and a way to read
// it back.
type Device struct {
	Mem  backend.GPUMemory                // at least 4 MiB
	Read func(addr uintptr, n int) []byte // the n bytes at addr
}

// nobody is the caller of the caller subtest.
const nobody = 65534

// Run runs every check as a subtest of t.
func Run(t *testing.T, c Config) {
	t.Run("Bytes", func(t *testing.T) { testBytes(t, c) })
	t.Run("Cancelled", func(t *testing.T) { testCancelled(t, c) })
	t.Run("FailedSample", func(t *testing.T) { testFailed(t, c) })
	t.Run("AsCaller", func(t *testing.T) { testAsCaller(t, c) })
}

// fileSizes are the whole-file samples' sizes: around a block, a few
// blocks, many.
var fileSizes = []int{1, 100, 4095, 4096, 4097, 70000, 300001}

// tensorLen is the length of each .npy sample's uint8 data, which starts
// at byte 128 of its file (np.save's header): Request.At is 128.
const tensorLen = 5000

// dir returns the directory the datasets go under.
func (c Config) dir(t *testing.T) string {
	d := ""
	if c.Dir != nil {
		d = c.Dir(t)
	} else {
		d = t.TempDir()
	}
	for _, p := range []string{filepath.Dir(d), d} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// content returns the bytes of sample n: a pattern no two samples share.
func content(n, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i*7 + n*31 + i>>12)
	}
	return b
}

// write writes b to path (its directory made), with mode.
func write(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

// fileMap writes the whole-file samples under dir/files, in two classes,
// and maps them.
func fileMap(t *testing.T, dir string) *bmap.Map {
	t.Helper()
	root := filepath.Join(dir, "files")
	for i, n := range fileSizes {
		write(t, filepath.Join(root, string(rune('a'+i%2)), fmt.Sprintf("%d.jpg", i)), content(i, n), 0o644)
	}
	return build(t, root, bmap.ReaderFile)
}

// tensorMap writes .npy samples of one size under dir/tensors and maps
// them: each sample is its data, past a 128-byte header.
func tensorMap(t *testing.T, dir string) *bmap.Map {
	t.Helper()
	root := filepath.Join(dir, "tensors")
	h, err := npy.Encode(npy.Header{DType: npy.Uint8, Shape: []int64{tensorLen}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		write(t, filepath.Join(root, fmt.Sprintf("%d.npy", i)), append(bytes.Clone(h), content(100+i, tensorLen)...), 0o644)
	}
	m := build(t, root, bmap.ReaderNumpy)
	if at := m.Samples[0].Offset % backend.Align; at == 0 {
		t.Fatalf("the tensors' data starts at %d: want a phase, so that At is not 0", m.Samples[0].Offset)
	}
	return m
}

func build(t *testing.T, root string, r bmap.Reader) *bmap.Map {
	t.Helper()
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{Reader: r})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// open opens the backend over m with env (its Logger set here).
func (c Config) open(t *testing.T, m *bmap.Map, env backend.Env) backend.Backend {
	t.Helper()
	p, err := c.Spec.Resolve(c.Options)
	if err != nil {
		t.Fatal(err)
	}
	if env.Logger == nil {
		env.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Device != nil {
		mem := c.Device.Mem
		env.GPU = &mem
	}
	b, err := c.Spec.Open(m, p, env)
	if err != nil {
		t.Fatalf("backend %s: open: %v", c.Spec.Name, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("backend %s: close: %v", c.Spec.Name, err)
		}
	})
	return b
}

// batch is one batch's requests and the memory they point into.
type batch struct {
	reqs []backend.Request
	c    Config
}

// requests makes requests for samples idx of m: ragged rooms (each
// Align-aligned, the data at its phase At) or, dense, rows back to back
// from an address that is not aligned.
func (c Config) requests(t *testing.T, m *bmap.Map, idx []int, dense bool) *batch {
	t.Helper()
	const lead = 64 // a dense batch's first row: not aligned
	var total int64 = lead
	for _, i := range idx {
		total += backend.AlignUp(m.Samples[i].Offset%backend.Align + m.Samples[i].Size)
	}
	b := &batch{c: c}
	var host []byte
	if c.Device == nil {
		var err error
		if host, err = unix.Mmap(-1, 0, int(backend.AlignUp(total)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(host) })
	} else if total > c.Device.Mem.Size {
		t.Fatalf("the device memory holds %d bytes, the batch needs %d", c.Device.Mem.Size, total)
	}
	var off int64
	if dense {
		off = lead
	}
	for _, i := range idx {
		s := &m.Samples[i]
		r := backend.Request{Index: i, Sample: s}
		at, room := s.Offset%backend.Align, backend.AlignUp(s.Offset%backend.Align+s.Size)
		if dense {
			at, room = 0, s.Size
		}
		if c.Device != nil {
			r.Dev, r.DevRoom = c.Device.Mem.Base+uintptr(off+at), room-at
		} else {
			r.Buf, r.At = host[off:off+room:off+room], at
		}
		b.reqs = append(b.reqs, r)
		off += room
	}
	return b
}

// got returns request k's bytes as the backend left them.
func (b *batch) got(k int) []byte {
	r := &b.reqs[k]
	if b.c.Device != nil {
		return b.c.Device.Read(r.Dev, int(r.Sample.Size))
	}
	return r.Data()
}

// want returns sample s's bytes in its file under m's root.
func want(t *testing.T, m *bmap.Map, s *bmap.Sample) []byte {
	t.Helper()
	f, err := os.ReadFile(filepath.Join(m.Root, s.Path))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(f)) < s.Offset+s.Size {
		return nil
	}
	return f[s.Offset : s.Offset+s.Size]
}

// read runs ReadBatch under a deadline: a backend that hangs fails.
func read(t *testing.T, be backend.Backend, ctx context.Context, reqs []backend.Request) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- be.ReadBatch(ctx, reqs) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("ReadBatch of %d requests did not return in a minute", len(reqs))
		return nil
	}
}

// all returns 0..n-1.
func all(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// testBytes: every sample's bytes land where its request says, whole
// files and tensors (At > 0), ragged and dense; Stats then names its
// counters and labels well.
func testBytes(t *testing.T, c Config) {
	dir := c.dir(t)
	for _, tc := range []struct {
		name  string
		m     *bmap.Map
		dense bool
	}{
		{"files", fileMap(t, dir), false},
		{"tensors", tensorMap(t, dir), false},
		{"tensors dense", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.m
			if m == nil {
				m = build(t, filepath.Join(dir, "tensors"), bmap.ReaderNumpy)
			}
			be := c.open(t, m, backend.Env{})
			b := c.requests(t, m, all(len(m.Samples)), tc.dense)
			if err := read(t, be, context.Background(), b.reqs); err != nil {
				t.Fatalf("ReadBatch: %v", err)
			}
			for k, r := range b.reqs {
				if r.Err != nil {
					t.Errorf("sample %d: %v", r.Index, r.Err)
				} else if !bytes.Equal(b.got(k), want(t, m, r.Sample)) {
					t.Errorf("sample %d (%s, at %d): the bytes read differ from the file's [%d, %d)", r.Index, r.Sample.Path, r.At, r.Sample.Offset, r.Sample.Offset+r.Sample.Size)
				}
			}
			checkStats(t, be.Stats())
		})
	}
}

// snake is a Stats name.
var snake = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// checkStats checks that every label and counter has a snake_case name
// of its own, no counter is negative, and the JSON form is one object.
func checkStats(t *testing.T, st backend.Stats) {
	t.Helper()
	seen := map[string]bool{}
	name := func(kind, n string) {
		if !snake.MatchString(n) || seen[n] || n == "engine" {
			t.Errorf("stats: %s name %q: want snake_case, unique, not engine", kind, n)
		}
		seen[n] = true
	}
	for _, l := range st.Labels {
		name("label", l.Name)
	}
	for _, c := range st.Counters {
		name("counter", c.Name)
		if c.Value < 0 {
			t.Errorf("stats: counter %s is %d", c.Name, c.Value)
		}
	}
	js, err := json.Marshal(st)
	var obj map[string]any
	if err == nil {
		err = json.Unmarshal(js, &obj)
	}
	if err != nil {
		t.Errorf("stats: JSON: %v (%s)", err, js)
	}
}

// testCancelled: a batch whose context has ended returns (in time) an
// error: ctx's, or its samples'. (Requests without Err may be unread:
// abandoned.)
func testCancelled(t *testing.T, c Config) {
	m := fileMap(t, c.dir(t))
	be := c.open(t, m, backend.Env{})
	b := c.requests(t, m, all(len(m.Samples)), false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := read(t, be, ctx, b.reqs)
	failed := false
	for _, r := range b.reqs {
		failed = failed || r.Err != nil
	}
	if err == nil || !errors.Is(err, context.Canceled) && !failed {
		t.Errorf("ReadBatch with a cancelled context: %v, want context.Canceled or failed samples", err)
	}
}

// testFailed: a sample whose file changed size since mapping fails as a
// *backend.SampleError naming it, and ReadBatch returns an error; the
// others read right.
func testFailed(t *testing.T, c Config) {
	m := fileMap(t, c.dir(t))
	victim := len(m.Samples) - 1 // the largest
	s := &m.Samples[victim]
	if err := os.Truncate(filepath.Join(m.Root, s.Path), s.Size/2); err != nil {
		t.Fatal(err)
	}
	be := c.open(t, m, backend.Env{})
	b := c.requests(t, m, all(len(m.Samples)), false)
	err := read(t, be, context.Background(), b.reqs)
	if err == nil {
		t.Errorf("ReadBatch: nil error with sample %d cut short", victim)
	}
	for k, r := range b.reqs {
		switch {
		case r.Index == victim:
			var se *backend.SampleError
			if !errors.As(r.Err, &se) || se.Index != victim {
				t.Errorf("sample %d cut short: Err = %v, want a *backend.SampleError of sample %d", victim, r.Err, victim)
			}
		case r.Err != nil:
			t.Errorf("sample %d: %v", r.Index, r.Err)
		case !bytes.Equal(b.got(k), want(t, m, r.Sample)):
			t.Errorf("sample %d: the bytes read differ from the file", r.Index)
		}
	}
}

// testAsCaller: with Env.Cred (nobody), a file nobody may read (mode
// 0602: others may write it, not read it) fails with a permission error,
// and one anyone may read reads right. It needs root.
func testAsCaller(t *testing.T, c Config) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "reading as another user needs root")
	}
	dir := c.dir(t)
	root := filepath.Join(dir, "caller")
	write(t, filepath.Join(root, "a", "open.jpg"), content(1, 5000), 0o644)
	write(t, filepath.Join(root, "a", "secret.jpg"), content(2, 5000), 0o602)
	m := build(t, root, bmap.ReaderFile)
	be := c.open(t, m, backend.Env{Cred: &backend.Cred{UID: nobody, GID: nobody}})
	b := c.requests(t, m, all(len(m.Samples)), false)
	err := read(t, be, context.Background(), b.reqs)
	for k, r := range b.reqs {
		switch filepath.Base(r.Sample.Path) {
		case "secret.jpg":
			if !errors.Is(r.Err, fs.ErrPermission) {
				t.Errorf("%s (0602) read as nobody: Err = %v, want a permission error", r.Sample.Path, r.Err)
			}
		default:
			if r.Err != nil {
				t.Errorf("%s (0644) read as nobody: %v", r.Sample.Path, r.Err)
			} else if !bytes.Equal(b.got(k), want(t, m, r.Sample)) {
				t.Errorf("%s read as nobody: the bytes differ from the file", r.Sample.Path)
			}
		}
	}
	if err == nil {
		t.Errorf("ReadBatch: nil error with a sample nobody may read")
	}
}
