// SPDX-License-Identifier: Apache-2.0

package cufile

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/internal/samplefile"
)

// preadReader is the test double of cuFile: "device memory" is a host
// mapping, and a read is a pread into it at the destination's offset.
type preadReader struct {
	mem    []byte
	reads  atomic.Int64
	closed bool
}

func (p *preadReader) base() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(p.mem))) }

func (p *preadReader) Read(_ int, fd int, dst uintptr, size, at int64) (int64, error) {
	off := int64(dst - p.base())
	p.reads.Add(1)
	n, err := samplefile.PreadUpTo(fd, p.mem[off:off+size], at)
	return int64(n), err
}

func (p *preadReader) Stats() modeStats {
	return modeStats{Mode: "compat", Why: "a test double", POSIX: p.reads.Load()}
}
func (p *preadReader) Close() error { p.closed = true; return nil }

// requests lays the samples out as the loader does: 4 KiB-aligned
// destinations in one allocation.
func requests(m *bmap.Map, base uintptr) ([]backend.Request, []int64) {
	var reqs []backend.Request
	var offs []int64
	var off int64
	for i := range m.Samples {
		s := &m.Samples[i]
		reqs = append(reqs, backend.Request{Index: i, Sample: s, Dev: base + uintptr(off)})
		offs = append(offs, off)
		off += backend.AlignUp(s.Size)
	}
	return reqs, offs
}

func dataset(t *testing.T, root string) *bmap.Map {
	for i := range 12 {
		p := filepath.Join(root, []string{"a", "b", "c"}[i%3], "s"+string(rune('0'+i%10))+string(rune('a'+i))+".jpg")
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte(i + 1), byte(i * 3)}, 900+i*1777), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return testfs.MapDir(t, root)
}

// TestReadsIntoDeviceDestinations: every sample lands byte-exact at its
// Request.Dev, through files opened O_DIRECT on ext4 (a loop device) and
// on whatever filesystem holds the temporary directory (O_DIRECT or not).
func TestReadsIntoDeviceDestinations(t *testing.T) {
	roots := map[string]func(t *testing.T) string{
		"tmpdir": func(t *testing.T) string { return t.TempDir() },
		"ext4":   func(t *testing.T) string { return testfs.New(t, testfs.Ext4()).Path("train") },
	}
	for name, root := range roots {
		t.Run(name, func(t *testing.T) {
			m := dataset(t, root(t))
			mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(mem)
			r := &preadReader{mem: mem}
			b, err := New(m, 3, r, backend.Env{})
			if err != nil {
				t.Fatal(err)
			}
			reqs, offs := requests(m, r.base())
			if err := b.ReadBatch(context.Background(), reqs); err != nil {
				t.Fatal(err)
			}
			for i, s := range m.Samples {
				want, _ := os.ReadFile(filepath.Join(m.Root, s.Path))
				if got := mem[offs[i] : offs[i]+s.Size]; !bytes.Equal(got, want) {
					t.Fatalf("sample %d (%s): bytes differ at its device destination", i, s.Path)
				}
			}
			if st := b.Stats(); st.Counter("samples") != int64(len(reqs)) || st.Counter("errors") != 0 || st.Label("cufile_mode") != "compat" || st.Counter("cufile_posix_reads") != int64(len(reqs)) {
				t.Errorf("stats %+v", st)
			}
			if err := b.Close(); err != nil || !r.closed {
				t.Errorf("Close: %v, reader closed %v", err, r.closed)
			}
		})
	}
}

// TestSampleErrors: a missing file, a file that changed length, an
// injected EIO and a request without a device destination each fail as a
// *backend.SampleError naming the sample; the others are still read.
func TestSampleErrors(t *testing.T) {
	m := dataset(t, t.TempDir())
	mem, _ := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	defer unix.Munmap(mem)
	r := &preadReader{mem: mem}
	defer faults.Install((&faults.Faults{}).Add(faults.Rule{Op: faults.FileRead, Path: m.Samples[2].Path, Err: syscall.EIO}))()
	b, err := New(m, 2, r, backend.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	os.Remove(filepath.Join(m.Root, m.Samples[0].Path))
	os.WriteFile(filepath.Join(m.Root, m.Samples[1].Path), []byte("grown? no: shorter"), 0o644)
	reqs, _ := requests(m, r.base())
	reqs[3].Dev = 0
	if err := b.ReadBatch(context.Background(), reqs); err == nil {
		t.Fatal("no error")
	}
	for i, want := range map[int]string{0: "open", 1: "map says", 2: "input/output error", 3: "no device destination"} {
		var se *backend.SampleError
		if !errors.As(reqs[i].Err, &se) || se.Index != i || !strings.Contains(se.Error(), m.Samples[i].Path) || !strings.Contains(se.Error(), want) {
			t.Errorf("request %d: %v, want a SampleError naming %s and %q", i, reqs[i].Err, m.Samples[i].Path, want)
		}
	}
	if !errors.Is(reqs[1].Err, backend.ErrShortRead) {
		t.Errorf("changed length: %v, want ErrShortRead", reqs[1].Err)
	}
	for i := 4; i < len(reqs); i++ {
		if reqs[i].Err != nil {
			t.Errorf("request %d failed: %v", i, reqs[i].Err)
		}
	}
	if st := b.Stats(); st.Counter("errors") != 4 {
		t.Errorf("%d errors counted, want 4", st.Counter("errors"))
	}
}

// TestOpenNeedsGPUMemory: over host memory the backend refuses to open,
// saying what to do; without a driver it says cuFile is unavailable.
func TestOpenNeedsGPUMemory(t *testing.T) {
	m := dataset(t, t.TempDir())
	spec := Spec(nil)
	if !spec.DeviceWrites {
		t.Fatal("the cufile backend must declare DeviceWrites")
	}
	p, err := spec.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := spec.Open(m, p, backend.Env{}); !errors.Is(err, backend.ErrOptions) || !strings.Contains(err.Error(), "memory gpu") {
		t.Errorf("over host memory: %v, want ErrOptions asking for memory gpu", err)
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("an NVIDIA driver is present")
	}
	if _, err := spec.Open(m, p, backend.Env{GPU: &backend.GPUMemory{Base: 1 << 40, Size: 1 << 20}}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("without a driver: %v, want ErrUnavailable", err)
	}
}

// TestOpenForCuFile: the descriptor handed to cuFileHandleRegister is the
// mapped file without O_NONBLOCK (real cuFile refuses it:
// CU_FILE_INVALID_FILE_OPEN_FLAG), and a FIFO swapped in at a sample's
// path fails the open at once as another file than the one mapped
// (O_NONBLOCK is cleared only after that check), never blocking it.
func TestOpenForCuFile(t *testing.T) {
	root := t.TempDir()
	m := dataset(t, root)
	b, err := New(m, 1, &preadReader{mem: make([]byte, 1<<20)}, backend.Env{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fd, err := b.openSample(&m.Samples[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	unix.Close(fd)
	if err != nil || fl&unix.O_NONBLOCK != 0 {
		t.Errorf("flags %#x (%v): O_NONBLOCK still set", fl, err)
	}
	p := filepath.Join(root, m.Samples[1].Path)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		fd, err := b.openSample(&m.Samples[1], nil)
		if err == nil {
			unix.Close(fd)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, samplefile.ErrReplaced) {
			t.Errorf("a FIFO at the path: %v, want ErrReplaced", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the open of a FIFO swapped in blocked")
	}
}
