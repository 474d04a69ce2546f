// SPDX-License-Identifier: Apache-2.0

package standin

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"unsafe"

	"github.com/nvfeed/nvfeed/internal/cuda"
)

// writeFile writes n pattern bytes to a file in dir and opens it twice:
// O_DIRECT and buffered.
func writeFile(dir string, n int) (data []byte, direct, buffered *os.File, err error) {
	data = pattern(n, 9)
	p := filepath.Join(dir, "samples")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		return nil, nil, nil, err
	}
	if direct, err = os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0); err != nil {
		return nil, nil, nil, fmt.Errorf("O_DIRECT open: %w", err)
	}
	if buffered, err = os.Open(p); err != nil {
		direct.Close()
		return nil, nil, nil, err
	}
	return data, direct, buffered, nil
}

func testFile(tb testing.TB, dir string, n int) (data []byte, direct, buffered *os.File) {
	tb.Helper()
	data, direct, buffered, err := writeFile(dir, n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { direct.Close(); buffered.Close() })
	return data, direct, buffered
}

// statsUUIDs reads the per-GPU UUIDs of cuFileGetStatsL3, in its order.
func (a *api) statsUUIDs(tb testing.TB) [][16]byte {
	tb.Helper()
	buf := make([]byte, 5000)
	if r := a.cuFileGetStatsL3(unsafe.Pointer(&buf[0])); int32(r) != 0 {
		tb.Fatalf("cuFileGetStatsL3: %d", int32(r))
	}
	var out [][16]byte
	for i := range binary.LittleEndian.Uint32(buf[1024:]) {
		out = append(out, [16]byte(buf[1032+248*i:]))
	}
	return out
}

// TestCuFileRead reads a file into device memory through the project's
// cuFile bindings: byte-exact for aligned reads, unaligned ones (through
// an aligned bounce on the O_DIRECT descriptor), buffered descriptors,
// short reads at the end of the file, registered and unregistered
// buffers; nothing outside the range asked for is written (O_DIRECT may
// write a whole last block of the file, as a DMA would). The level-3
// statistics list both GPUs, the reading one first (reverse ordinal
// order), with its UUID and the reads as nvidia-fs reads.
func TestCuFileRead(t *testing.T) {
	a := loadAPI(t)
	before := a.report(t)
	defer a.onDevice(t, 1)()
	c, err := cuda.LoadCuFile(filepath.Join(a.dir, CuFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	const size = 3*4096 + 123
	data, direct, buffered := testFile(t, t.TempDir(), size)
	fhDirect, err := c.RegisterFile(int(direct.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	fhBuffered, err := c.RegisterFile(int(buffered.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	registered, unregistered := a.alloc(t, 1, gran, true), a.alloc(t, 1, gran, false)
	if err := c.RegisterBuffer(registered.ptr, int64(registered.size)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name                  string
		fh                    uintptr
		mem                   devMem
		fileOff, n, bufOff, w int64 // w: the bytes the read returns
	}{
		{"aligned, short at the end", fhDirect, registered, 0, 4 * 4096, 0, size},
		{"aligned, at a buffer offset", fhDirect, registered, 4096, 4096, 8192, 4096},
		{"unaligned through a bounce", fhDirect, registered, 100, 5000, 3, 5000},
		{"unaligned to the end", fhDirect, unregistered, 4097, size, 4095, size - 4097},
		{"buffered descriptor", fhBuffered, unregistered, 7, size, 1, size - 7},
		{"at the end of the file", fhDirect, registered, size, 4096, 0, 0},
	}
	for _, tc := range cases {
		dst := bytesAt(tc.mem.ptr, tc.mem.size)
		for i := range dst[:64<<10] {
			dst[i] = 0xaa
		}
		got, err := c.Read(tc.fh, tc.mem.ptr, tc.n, tc.fileOff, tc.bufOff)
		switch {
		case err != nil || got != tc.w:
			t.Errorf("%s: read %d, %v; want %d", tc.name, got, err, tc.w)
		case !bytes.Equal(dst[tc.bufOff:tc.bufOff+got], data[tc.fileOff:tc.fileOff+got]):
			t.Errorf("%s: the bytes read differ from the file's", tc.name)
		case bytes.Count(dst[:tc.bufOff], []byte{0xaa}) != int(tc.bufOff) || dst[tc.bufOff+tc.n] != 0xaa:
			t.Errorf("%s: bytes outside the %d asked for were written", tc.name, tc.n)
		}
	}
	reads, err := c.Reads()
	if err != nil {
		t.Fatal(err)
	}
	if len(reads) != 2 || reads[0].NVFS != uint64(len(cases)) || reads[0].Mode() != "gds" || reads[1].Total != 0 {
		t.Errorf("per-GPU reads %+v: want 2 GPUs, the reading one (ordinal 1) first with %d nvidia-fs reads", reads, len(cases))
	}
	if u := a.statsUUIDs(t); len(u) != 2 || u[0] != uuidOf(1) || u[1] != uuidOf(0) {
		t.Errorf("statistics' UUIDs %q, want GPU 1's then GPU 0's", u)
	}
	if err := firstError(c.DeregisterBuffer(registered.ptr)); err != nil {
		t.Error(err)
	}
	c.DeregisterFile(fhDirect)
	c.DeregisterFile(fhBuffered)
	a.free(t, registered)
	a.free(t, unregistered)
	if err := c.Close(); err != nil {
		t.Error(err)
	}
	a.wantViolation(t, before, "")
	if after := a.report(t); after.Live["cufile_handles"] != before.Live["cufile_handles"] ||
		after.Live["cufile_buffers"] != before.Live["cufile_buffers"] || after.CuFileDriverOpen != before.CuFileDriverOpen {
		t.Errorf("after deregistering and closing: %+v, want the counts of %+v", after, before)
	}
}

// TestCuFileRules breaks each cuFile precondition the stand-in enforces.
func TestCuFileRules(t *testing.T) {
	a := loadAPI(t)
	runtime.LockOSThread() // never unlocked: the thread ends with the test
	must(t, "cuInit", a.cuInit(0))
	dir := t.TempDir()
	_, direct, buffered := testFile(t, dir, 8192)
	fileErr := func(r uint64) int32 { return int32(r) }
	descr := func(f *os.File) *cuda.FileDescr { return &cuda.FileDescr{Type: 1, Handle: f.Fd()} }

	// Before cuFileDriverOpen.
	before := a.report(t)
	if got := fileErr(a.cuFileDriverClose()); got != 5001 {
		t.Errorf("close of a driver not open: %d, want 5001", got)
	}
	var fh uintptr
	if got := fileErr(a.cuFileHandleRegister(&fh, descr(direct))); got != 5001 {
		t.Errorf("a handle registered before cuFileDriverOpen: %d, want 5001", got)
	}
	if v := a.newViolations(t, before); len(v) != 2 {
		t.Errorf("violations %q, want 2", v)
	}
	if r := fileErr(a.cuFileDriverOpen()); r != 0 {
		t.Fatalf("cuFileDriverOpen: %d", r)
	}
	defer a.cuFileDriverClose()
	must(t, "cuFileHandleRegister", int32(a.cuFileHandleRegister(&fh, descr(direct))))
	defer a.cuFileHandleDeregister(fh)

	done1 := a.onDevice(t, 1)
	mem := a.alloc(t, 1, 2*gran, true)
	plain := a.alloc(t, 1, gran, false)
	done1()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()

	for _, c := range []struct {
		name, violation string
		code            int64
		device          int // the context current, -1 none
		run             func(t *testing.T) int64
	}{
		{"a buffer registered without a context", "no current CUDA context", 5047, -1, func(t *testing.T) int64 {
			return int64(fileErr(a.cuFileBufRegister(mem.ptr, mem.size, 0)))
		}},
		{"a buffer registered in another GPU's context", "the current context on GPU 0", 5015, 0, func(t *testing.T) int64 {
			return int64(fileErr(a.cuFileBufRegister(mem.ptr, mem.size, 0)))
		}},
		{"a buffer without gpuDirectRDMACapable", "without gpuDirectRDMACapable", 5022, 1, func(t *testing.T) int64 {
			return int64(fileErr(a.cuFileBufRegister(plain.ptr, plain.size, 0)))
		}},
		{"host memory registered", "is not mapped device memory", 5012, 1, func(t *testing.T) int64 {
			b := hostMem(t, 4096)
			return int64(fileErr(a.cuFileBufRegister(addr(b), 4096, 0)))
		}},
		{"a buffer registered twice", "overlaps the registered", 5023, 1, func(t *testing.T) int64 {
			must(t, "cuFileBufRegister", fileErr(a.cuFileBufRegister(mem.ptr, gran, 0)))
			defer a.cuFileBufDeregister(mem.ptr)
			return int64(fileErr(a.cuFileBufRegister(mem.ptr+4096, 4096, 0)))
		}},
		{"a deregister of what is not registered", "is not a registered buffer's base", 5022, 1, func(t *testing.T) int64 {
			return int64(fileErr(a.cuFileBufDeregister(mem.ptr)))
		}},
		{"a read without a context", "no current CUDA context", -5047, -1, func(t *testing.T) int64 {
			return a.cuFileRead(fh, mem.ptr, 4096, 0, 0)
		}},
		{"a read in another GPU's context", "the current context on GPU 0", -5015, 0, func(t *testing.T) int64 {
			return a.cuFileRead(fh, mem.ptr, 4096, 0, 0)
		}},
		{"a read into host memory", "is not mapped device memory", -5012, 1, func(t *testing.T) int64 {
			b := hostMem(t, 4096)
			return a.cuFileRead(fh, addr(b), 4096, 0, 0)
		}},
		{"a read past its registered buffer", "runs past the registered buffer", -5014, 1, func(t *testing.T) int64 {
			must(t, "cuFileBufRegister", fileErr(a.cuFileBufRegister(mem.ptr, gran, 0)))
			defer a.cuFileBufDeregister(mem.ptr)
			return a.cuFileRead(fh, mem.ptr, 8192, 0, gran-4096)
		}},
		{"a read with a deregistered handle", "deregistered (use after release)", -5027, 1, func(t *testing.T) int64 {
			var h uintptr
			must(t, "cuFileHandleRegister", int32(a.cuFileHandleRegister(&h, descr(buffered))))
			a.cuFileHandleDeregister(h)
			return a.cuFileRead(h, mem.ptr, 4096, 0, 0)
		}},
		{"a handle of a file registered twice", "is already registered", 5028, -1, func(t *testing.T) int64 {
			var h uintptr
			return int64(fileErr(a.cuFileHandleRegister(&h, descr(direct))))
		}},
		{"a handle of what is not a regular file", "is not a regular file", 5018, -1, func(t *testing.T) int64 {
			var h uintptr
			return int64(fileErr(a.cuFileHandleRegister(&h, descr(devNull))))
		}},
		{"a handle of an O_NONBLOCK descriptor", "is O_NONBLOCK", 5019, -1, func(t *testing.T) int64 {
			fd, err := syscall.Open(buffered.Name(), syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Close(fd)
			var h uintptr
			return int64(fileErr(a.cuFileHandleRegister(&h, &cuda.FileDescr{Type: 1, Handle: uintptr(fd)})))
		}},
		{"a handle on a device udev has no record of", "udev property not found: ID_FS_USAGE", 5027, -1, func(t *testing.T) int64 {
			t.Setenv("NVFEED_CUFILE_UDEV", t.TempDir())
			var h uintptr
			return int64(fileErr(a.cuFileHandleRegister(&h, descr(buffered))))
		}},
		{"an unmap of memory still registered", "still registered with cuFileBufRegister", 0, 1, func(t *testing.T) int64 {
			m := a.alloc(t, 1, gran, true)
			must(t, "cuFileBufRegister", fileErr(a.cuFileBufRegister(m.ptr, m.size, 0)))
			a.free(t, m)
			return int64(fileErr(a.cuFileBufDeregister(m.ptr)))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			runtime.LockOSThread() // never unlocked: the thread ends with the case
			if c.device >= 0 {
				defer a.onDevice(t, c.device)()
			}
			before := a.report(t)
			if got := c.run(t); got != c.code {
				t.Errorf("returned %d, want %d", got, c.code)
			}
			a.wantViolation(t, before, c.violation)
		})
	}
	defer a.onDevice(t, 1)()
	a.free(t, mem)
	a.free(t, plain)
}

// TestCuFileModes runs cuFile in a second process per setting:
// CUFILE_STANDIN_MODE (compat: the GPUs listed as real cuFile does, POSIX
// reads, nvfs 0.0) and the
// injected failures (bufregister: the documented error, unregistered
// reads still work; read-eio: -1 with errno EIO), none a violation.
func TestCuFileModes(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want cuFileResult
	}{
		{nil, cuFileResult{GPUs: 2, Major: 2, Read: 4096, NVFS: 1}},
		{[]string{ModeVar + "=compat"}, cuFileResult{GPUs: 2, Major: 0, Read: 4096, POSIX: 1}},
		{[]string{FailVar + "=bufregister"}, cuFileResult{GPUs: 2, Major: 2, Register: 5045, Read: 4096, NVFS: 1}},
		{[]string{FailVar + "=read-eio," + ModeVar + "=gds"}, cuFileResult{GPUs: 2, Major: 2, Read: -1, Errno: 5}},
	} {
		t.Run(fmt.Sprint(c.env), func(t *testing.T) {
			out, reports := helper(t, "cufile-env", nil, append(c.env, "STANDIN_TEST_DIR="+t.TempDir())...)
			var got cuFileResult
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("helper output %q: %v", out, err)
			}
			if got != c.want {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
			CheckClean(t, reports)
			r, _ := ReadReports(reports)
			if len(r) != 1 || r[0].CuFileReads != 1 {
				t.Errorf("reports %+v: want one process with one cuFileRead", r)
			}
		})
	}
}

type cuFileResult struct {
	GPUs, Major    int
	Register, Read int64
	Errno          int32
	NVFS           uint64 // the reading GPU's nvidia-fs reads
	POSIX          uint64 // the reading GPU's POSIX (compatibility mode) reads
}

func helperCuFileEnv(a *api) error {
	_, direct, _, err := writeFile(os.Getenv("STANDIN_TEST_DIR"), 8192)
	if err != nil {
		return err
	}
	if err := check("cuInit", a.cuInit(0)); err != nil {
		return err
	}
	var ctx, old uintptr
	a.cuPrimaryCtxRetain(&ctx, 0)
	a.cuCtxPushCurrent(ctx)
	var m devMem
	p := prop(0, 1, true)
	access := cuda.MemAccessDesc{Location: p.Location, Flags: 3}
	m.size = gran
	if err := check("alloc", a.cuMemCreate(&m.h, gran, &p, 0)|a.cuMemAddressReserve(&m.ptr, gran, 0, 0, 0)); err != nil {
		return err
	}
	if err := check("map", a.cuMemMap(m.ptr, gran, 0, m.h, 0)|a.cuMemSetAccess(m.ptr, gran, &access, 1)); err != nil {
		return err
	}
	var res cuFileResult
	props := make([]byte, 56)
	var fh uintptr
	if r := a.cuFileDriverOpen() | a.cuFileSetStatsLevel(3) | a.cuFileStatsStart() | a.cuFileDriverGetProps(unsafe.Pointer(&props[0])) |
		a.cuFileHandleRegister(&fh, &cuda.FileDescr{Type: 1, Handle: direct.Fd()}); r != 0 {
		return fmt.Errorf("cuFile setup: %#x", r)
	}
	res.Major = int(binary.LittleEndian.Uint32(props))
	res.Register = int64(int32(a.cuFileBufRegister(m.ptr, m.size, 0)))
	res.Read = a.cuFileRead(fh, m.ptr, 4096, 4096, 0)
	if res.Read < 0 {
		res.Errno = *a.errnoLocation()
	} else if !bytes.Equal(bytesAt(m.ptr, 4096), pattern(8192, 9)[4096:]) {
		return fmt.Errorf("the bytes read differ from the file's")
	}
	stats := make([]byte, 5000)
	if r := a.cuFileGetStatsL3(unsafe.Pointer(&stats[0])); r != 0 {
		return fmt.Errorf("cuFileGetStatsL3: %#x", r)
	}
	res.GPUs = int(binary.LittleEndian.Uint32(stats[1024:]))
	if res.GPUs == 2 {
		res.NVFS = binary.LittleEndian.Uint64(stats[1032+248+64:]) // ordinal 0, listed last
		res.POSIX = binary.LittleEndian.Uint64(stats[1032+248+72:])
	}
	if res.Register == 0 {
		a.cuFileBufDeregister(m.ptr)
	}
	a.cuFileHandleDeregister(fh)
	if err := check("teardown", a.cuMemUnmap(m.ptr, gran)|a.cuMemAddressFree(m.ptr, gran)|a.cuMemRelease(m.h)|
		a.cuCtxPopCurrent(&old)|a.cuPrimaryCtxRelease(0)); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// TestRDMAOff: with CUDA_STANDIN_RDMA=0 device attribute 110 reads 0
// (driver and runtime), gpuDirectRDMACapable is refused at creation, and
// memory without it registers with cuFile.
func TestRDMAOff(t *testing.T) {
	out, reports := helper(t, "rdma-off", nil, RDMAVar+"=0")
	var got struct{ Driver, Runtime, Create, Register int32 }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	if got.Driver != 0 || got.Runtime != 0 || got.Create != 801 || got.Register != 0 {
		t.Errorf("got %+v, want attribute 110 = 0 twice, cuMemCreate with the RDMA flag 801, registration 0", got)
	}
	r, err := ReadReports(reports)
	if err != nil || len(r) != 1 || len(r[0].Violations) != 1 || len(r[0].Leaks()) != 0 {
		t.Errorf("reports %+v (%v): want one violation (the RDMA flag) and no leak", r, err)
	}
}

func helperRDMAOff(a *api) error {
	var out struct{ Driver, Runtime, Create, Register int32 }
	out.Driver, out.Runtime = -1, -1
	if err := check("setup", a.cuInit(0)|a.cudaSetDevice(0)); err != nil {
		return err
	}
	a.cuDeviceGetAttribute(&out.Driver, 110, 0)
	a.cudaDeviceGetAttribute(&out.Runtime, 110, 0)
	var h uint64
	p := prop(0, 1, true)
	out.Create = a.cuMemCreate(&h, gran, &p, 0)
	var m devMem
	p = prop(0, 1, false)
	access := cuda.MemAccessDesc{Location: p.Location, Flags: 3}
	if err := check("alloc", a.cuMemCreate(&m.h, gran, &p, 0)|a.cuMemAddressReserve(&m.ptr, gran, 0, 0, 0)); err != nil {
		return err
	}
	if err := check("map", a.cuMemMap(m.ptr, gran, 0, m.h, 0)|a.cuMemSetAccess(m.ptr, gran, &access, 1)); err != nil {
		return err
	}
	a.cuFileDriverOpen()
	out.Register = int32(a.cuFileBufRegister(m.ptr, gran, 0))
	a.cuFileBufDeregister(m.ptr)
	if err := check("teardown", a.cuMemUnmap(m.ptr, gran)|a.cuMemAddressFree(m.ptr, gran)|a.cuMemRelease(m.h)); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
