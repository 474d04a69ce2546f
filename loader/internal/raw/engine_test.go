// SPDX-License-Identifier: Apache-2.0

package raw

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/internal/uring"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// engineFixture is a 1 MiB file standing in for a device, and mmap'd
// memory to read it into.
type engineFixture struct {
	data []byte
	fd   int
	mem  []byte
}

func newEngineFixture(t *testing.T) *engineFixture {
	f := &engineFixture{data: make([]byte, 1<<20)}
	for i := range f.data {
		f.data[i] = byte(i*13 + i>>12)
	}
	path := filepath.Join(t.TempDir(), "dev")
	if err := os.WriteFile(path, f.data, 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	if f.mem, err = unix.Mmap(-1, 0, len(f.data)+8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(f.fd); unix.Munmap(f.mem) })
	return f
}

// run submits ops of size bytes covering [0, n) of the file (and one
// past its end when pastEnd) and waits for them.
func (f *engineFixture) run(t *testing.T, e engine, n, size int, pastEnd bool, path func(i int) string) []*ioOp {
	var ops []*ioOp
	for off := 0; off < n; off += size {
		ops = append(ops, &ioOp{off: int64(off), buf: f.mem[off : off+size], path: path(off / size)})
	}
	if pastEnd {
		ops = append(ops, &ioOp{off: int64(len(f.data)), buf: f.mem[len(f.data) : len(f.data)+4096], path: "past"})
	}
	g := newOpGroup(len(ops))
	for _, op := range ops {
		op.grp = g
	}
	e.submit(ops)
	select {
	case <-g.done:
	case <-time.After(20 * time.Second):
		t.Fatal("engine did not complete its ops")
	}
	return ops
}

// engines starts each engine over fd.
func engines(t *testing.T, fd, qd int) map[string]engine {
	out := map[string]engine{EnginePread: newPreadEngine(fd, qd, nil)}
	u, err := newUringEngine(fd, qd, ringSetup{}, nil)
	switch {
	case errors.Is(err, uring.ErrUnsupported):
		t.Logf("io_uring refused here (%v): testing the pread engine only", err)
	case err != nil:
		t.Fatal(err)
	default:
		out[EngineUring] = u
	}
	return out
}

func TestEnginesReadExactly(t *testing.T) {
	f := newEngineFixture(t)
	for name, e := range engines(t, f.fd, 8) {
		t.Run(name, func(t *testing.T) {
			defer e.close()
			clear(f.mem)
			ops := f.run(t, e, len(f.data), 4096, true, func(int) string { return "s" })
			for _, op := range ops[:len(ops)-1] {
				if op.err != nil {
					t.Fatalf("op at %d: %v", op.off, op.err)
				}
			}
			if !bytes.Equal(f.mem[:len(f.data)], f.data) {
				t.Error("bytes read differ from the file's")
			}
			if last := ops[len(ops)-1]; !errors.Is(last.err, ErrPastEnd) {
				t.Errorf("read past the end: err %v, want ErrPastEnd", last.err)
			}
			if p := e.peakInflight(); p < 1 || p > 8 {
				t.Errorf("peak in flight %d, want within the queue depth 8", p)
			}
		})
	}
}

func TestEnginesInjectedFaults(t *testing.T) {
	f := newEngineFixture(t)
	var all []*faults.Faults
	newFaults := func() *faults.Faults {
		ft := (&faults.Faults{}).
			Add(faults.Rule{Op: faults.DeviceRead, Path: "bad", Err: unix.EIO}).
			Add(faults.Rule{Op: faults.FileRead, Path: "short", Short: true}). // file reads only: never matches here
			Add(faults.Rule{Op: faults.DeviceRead, Path: "short", Short: true, Times: 1}).
			Add(faults.Rule{Op: faults.DeviceRead, Path: "slow", Stall: 50 * time.Millisecond})
		all = append(all, ft)
		return ft
	}
	names := func(i int) string {
		switch i {
		case 3:
			return "bad"
		case 5:
			return "short"
		case 7:
			return "slow"
		}
		return "ok"
	}
	const size = 16 << 10 // a short read returns half: 8 KiB
	for name, e := range engines(t, f.fd, 4) {
		t.Run(name, func(t *testing.T) {
			defer faults.Install(newFaults())()
			defer e.close()
			clear(f.mem)
			start := time.Now()
			ops := f.run(t, e, 16*size, size, false, names)
			if time.Since(start) < 50*time.Millisecond {
				t.Error("the stalled read did not stall")
			}
			for i, op := range ops {
				switch {
				case i == 3:
					if !errors.Is(op.err, unix.EIO) {
						t.Errorf("op %d: err %v, want EIO", i, op.err)
					}
				case i == 5 && name == EnginePread:
					// pread reads until full or EOF: a short result is the end of the device.
					if !errors.Is(op.err, ErrPastEnd) {
						t.Errorf("op %d: err %v, want ErrPastEnd", i, op.err)
					}
				default:
					// io_uring asks again for the rest of a short read.
					if op.err != nil || !bytes.Equal(op.buf, f.data[op.off:op.off+size]) {
						t.Errorf("op %d (%s): err %v or wrong bytes", i, names(i), op.err)
					}
				}
			}
		})
	}
	for _, ft := range all {
		if ft.Hits() != 3 {
			t.Errorf("faults hit %d reads, want 3 (bad, short once, slow)", ft.Hits())
		}
	}
}

func TestNewEngineRejectsUnknown(t *testing.T) {
	if _, _, err := newEngine("spdk", 0, 4, ringSetup{}, nil); !errors.Is(err, backend.ErrOptions) || !strings.Contains(err.Error(), `"spdk"`) {
		t.Errorf("err = %v", err)
	}
}
