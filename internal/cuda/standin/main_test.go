// SPDX-License-Identifier: Apache-2.0

package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"golang.org/x/sys/unix"
)

const (
	helperVar = "STANDIN_TEST_HELPER"    // names the helper a re-executed test binary runs
	cleanVar  = "STANDIN_TEST_CLEAN_ENV" // set in the process running the tests
	gran      = 2 << 20
)

// TestMain runs the tests in a child process whose environment is the
// stand-in's (Env: the C libraries read it once, when loaded), or, with
// helperVar set, one helper of a test (a second process).
func TestMain(m *testing.M) {
	if name := os.Getenv(helperVar); name != "" {
		os.Exit(runHelper(name))
	}
	if os.Getenv(cleanVar) == "" {
		os.Exit(reexec())
	}
	os.Exit(m.Run())
}

func reexec() int {
	dir, err := build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "standin:", err)
		return 1
	}
	reports, err := os.MkdirTemp("", "standin-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(reports)
	// cuFile's udev record of the temporary directory's device, where
	// the tests' files live (the stand-in refuses handles without one).
	var st syscall.Stat_t
	if err := syscall.Stat(os.TempDir(), &st); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	udev := filepath.Join(reports, "udev")
	rec := filepath.Join(udev, "data", fmt.Sprintf("b%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err := os.MkdirAll(filepath.Dir(rec), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(rec, []byte("E:ID_FS_USAGE=filesystem\n"), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = Env(dir, reports, cleanVar+"=1", "NVFEED_CUFILE_UDEV="+udev)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			return ee.ExitCode()
		}
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// api binds the stand-in's functions the tests call directly.
type api struct {
	dir string

	cuInit                  func(uint32) int32
	cuDeviceGet             func(*int32, int32) int32
	cuDeviceGetCount        func(*int32) int32
	cuDeviceGetUuid         func(*[16]byte, int32) int32
	cuDeviceGetPCIBusId     func(*byte, int32, int32) int32
	cuDeviceGetAttribute    func(*int32, int32, int32) int32
	cuPrimaryCtxRetain      func(*uintptr, int32) int32
	cuPrimaryCtxRelease     func(int32) int32
	cuCtxPushCurrent        func(uintptr) int32
	cuCtxPopCurrent         func(*uintptr) int32
	cuCtxSynchronize        func() int32
	cuMemCreate             func(*uint64, uintptr, *cuda.MemAllocationProp, uint64) int32
	cuMemRelease            func(uint64) int32
	cuMemAddressReserve     func(*uintptr, uintptr, uintptr, uintptr, uint64) int32
	cuMemAddressFree        func(uintptr, uintptr) int32
	cuMemMap                func(uintptr, uintptr, uintptr, uint64, uint64) int32
	cuMemUnmap              func(uintptr, uintptr) int32
	cuMemSetAccess          func(uintptr, uintptr, *cuda.MemAccessDesc, uintptr) int32
	cuMemExport             func(*int32, uint64, int32, uint64) int32
	cuMemImport             func(*uint64, uintptr, int32) int32
	cuMemHostRegister       func(uintptr, uintptr, uint32) int32
	cuMemHostUnregister     func(uintptr) int32
	cuMemcpyHtoD            func(uintptr, uintptr, uintptr) int32
	cuMemcpyDtoH            func(uintptr, uintptr, uintptr) int32
	cuStreamCreate          func(*uintptr, uint32) int32
	cuStreamDestroy         func(uintptr) int32
	cuStreamSynchronize     func(uintptr) int32
	cuEventCreate           func(*uintptr, uint32) int32
	cuEventRecord           func(uintptr, uintptr) int32
	cuEventQuery            func(uintptr) int32
	cuEventSynchronize      func(uintptr) int32
	cuEventDestroy          func(uintptr) int32
	cuStreamWaitEvent       func(uintptr, uintptr, uint32) int32
	cuGetProcAddress        func(string, *uintptr, int32, uint64, *int32) int32
	cuStandinLaunchRead     func(uintptr, uintptr, uintptr, uint32, uintptr) int32
	cuStandinReport         func(*byte, uintptr) uintptr
	cudaSetDevice           func(int32) int32
	cudaStreamCreate        func(*uintptr, uint32) int32
	cudaStreamDestroy       func(uintptr) int32
	cudaEventCreate         func(*uintptr, uint32) int32
	cudaEventRecord         func(uintptr, uintptr) int32
	cudaEventSynchronize    func(uintptr) int32
	cudaEventDestroy        func(uintptr) int32
	cudaMemcpyAsync         func(uintptr, uintptr, uintptr, int32, uintptr) int32
	cudaMemcpy2DAsync       func(uintptr, uintptr, uintptr, uintptr, uintptr, uintptr, int32, uintptr) int32
	cudaHostRegister        func(uintptr, uintptr, uint32) int32
	cudaHostUnregister      func(uintptr) int32
	cudaDeviceGetAttribute  func(*int32, int32, int32) int32
	cuFileDriverOpen        func() uint64
	cuFileDriverClose       func() uint64
	cuFileDriverGetProps    func(unsafe.Pointer) uint64
	cuFileHandleRegister    func(*uintptr, *cuda.FileDescr) uint64
	cuFileHandleDeregister  func(uintptr)
	cuFileBufRegister       func(uintptr, uintptr, int32) uint64
	cuFileBufDeregister     func(uintptr) uint64
	cuFileRead              func(uintptr, uintptr, uintptr, int64, int64) int64
	cuFileSetStatsLevel     func(int32) uint64
	cuFileStatsStart        func() uint64
	cuFileGetStatsL3        func(unsafe.Pointer) uint64
	errnoLocation           func() *int32
	libcuda, libcudart, cuf uintptr
}

// loadAPI loads the stand-in of this process's environment and binds api.
func loadAPI(tb testing.TB) *api {
	tb.Helper()
	a, err := openAPI(os.Getenv(LibDirVar))
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

func openAPI(dir string) (*api, error) {
	a := &api{dir: dir}
	open := func(name string) (uintptr, error) {
		return purego.Dlopen(filepath.Join(dir, name), purego.RTLD_NOW|purego.RTLD_LOCAL)
	}
	var err error
	if a.libcudart, err = open(Runtime); err != nil {
		return nil, err
	}
	if a.libcuda, err = open(Driver); err != nil {
		return nil, err
	}
	if a.cuf, err = open(CuFile); err != nil {
		return nil, err
	}
	libc, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, err
	}
	for lib, fns := range map[uintptr]map[string]any{
		a.libcuda: {
			"cuInit": &a.cuInit, "cuDeviceGet": &a.cuDeviceGet, "cuDeviceGetCount": &a.cuDeviceGetCount,
			"cuDeviceGetUuid_v2": &a.cuDeviceGetUuid, "cuDeviceGetPCIBusId": &a.cuDeviceGetPCIBusId,
			"cuDeviceGetAttribute": &a.cuDeviceGetAttribute, "cuDevicePrimaryCtxRetain": &a.cuPrimaryCtxRetain,
			"cuDevicePrimaryCtxRelease_v2": &a.cuPrimaryCtxRelease, "cuCtxPushCurrent_v2": &a.cuCtxPushCurrent,
			"cuCtxPopCurrent_v2": &a.cuCtxPopCurrent, "cuCtxSynchronize": &a.cuCtxSynchronize,
			"cuMemCreate": &a.cuMemCreate, "cuMemRelease": &a.cuMemRelease, "cuMemAddressReserve": &a.cuMemAddressReserve,
			"cuMemAddressFree": &a.cuMemAddressFree, "cuMemMap": &a.cuMemMap, "cuMemUnmap": &a.cuMemUnmap,
			"cuMemSetAccess": &a.cuMemSetAccess, "cuMemExportToShareableHandle": &a.cuMemExport,
			"cuMemImportFromShareableHandle": &a.cuMemImport, "cuMemHostRegister_v2": &a.cuMemHostRegister,
			"cuMemHostUnregister": &a.cuMemHostUnregister, "cuMemcpyHtoD_v2": &a.cuMemcpyHtoD,
			"cuMemcpyDtoH_v2": &a.cuMemcpyDtoH, "cuStreamCreate": &a.cuStreamCreate,
			"cuStreamDestroy_v2": &a.cuStreamDestroy, "cuStreamSynchronize": &a.cuStreamSynchronize,
			"cuEventCreate": &a.cuEventCreate, "cuEventRecord": &a.cuEventRecord, "cuEventQuery": &a.cuEventQuery,
			"cuEventSynchronize": &a.cuEventSynchronize, "cuEventDestroy_v2": &a.cuEventDestroy,
			"cuStreamWaitEvent": &a.cuStreamWaitEvent, "cuGetProcAddress_v2": &a.cuGetProcAddress,
			"cuStandinLaunchRead": &a.cuStandinLaunchRead, "cuStandinReport": &a.cuStandinReport,
		},
		a.libcudart: {
			"cudaSetDevice": &a.cudaSetDevice, "cudaStreamCreateWithFlags": &a.cudaStreamCreate,
			"cudaStreamDestroy": &a.cudaStreamDestroy, "cudaEventCreateWithFlags": &a.cudaEventCreate,
			"cudaEventRecord": &a.cudaEventRecord, "cudaEventSynchronize": &a.cudaEventSynchronize,
			"cudaEventDestroy": &a.cudaEventDestroy, "cudaMemcpyAsync": &a.cudaMemcpyAsync,
			"cudaMemcpy2DAsync": &a.cudaMemcpy2DAsync, "cudaHostRegister": &a.cudaHostRegister,
			"cudaHostUnregister": &a.cudaHostUnregister, "cudaDeviceGetAttribute": &a.cudaDeviceGetAttribute,
		},
		a.cuf: {
			"cuFileDriverOpen": &a.cuFileDriverOpen, "cuFileDriverClose_v2": &a.cuFileDriverClose,
			"cuFileDriverGetProperties": &a.cuFileDriverGetProps, "cuFileHandleRegister": &a.cuFileHandleRegister,
			"cuFileHandleDeregister": &a.cuFileHandleDeregister, "cuFileBufRegister": &a.cuFileBufRegister,
			"cuFileBufDeregister": &a.cuFileBufDeregister, "cuFileRead": &a.cuFileRead,
			"cuFileSetStatsLevel": &a.cuFileSetStatsLevel, "cuFileStatsStart": &a.cuFileStatsStart,
			"cuFileGetStatsL3": &a.cuFileGetStatsL3,
		},
		libc: {"__errno_location": &a.errnoLocation},
	} {
		for name, fn := range fns {
			sym, err := purego.Dlsym(lib, name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			purego.RegisterFunc(fn, sym)
		}
	}
	return a, nil
}

// report returns this process's report, as the stand-in has it now.
func (a *api) report(tb testing.TB) Report {
	tb.Helper()
	n := a.cuStandinReport(nil, 0)
	buf := make([]byte, n+1)
	a.cuStandinReport(&buf[0], uintptr(len(buf)))
	var r Report
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		tb.Fatalf("the stand-in's report %q: %v", buf[:n], err)
	}
	return r
}

// newViolations returns the violations recorded since the report before.
func (a *api) newViolations(tb testing.TB, before Report) []string {
	tb.Helper()
	return a.report(tb).Violations[len(before.Violations):]
}

// wantViolation fails tb unless exactly one violation was recorded since
// before and it contains want ("" asks for none).
func (a *api) wantViolation(tb testing.TB, before Report, want string) {
	tb.Helper()
	v := a.newViolations(tb, before)
	switch {
	case want == "" && len(v) > 0:
		tb.Errorf("violations %q, want none", v)
	case want != "" && (len(v) != 1 || !strings.Contains(v[0], want)):
		tb.Errorf("violations %q, want one containing %q", v, want)
	}
}

// onDevice locks the calling goroutine to its thread for good (the thread,
// and the contexts made current on it, end with the goroutine), makes
// ordinal's primary context current and returns a function that pops and
// releases it.
func (a *api) onDevice(tb testing.TB, ordinal int) func() {
	tb.Helper()
	runtime.LockOSThread()
	var ctx uintptr
	must(tb, "cuInit", a.cuInit(0))
	must(tb, "cuDevicePrimaryCtxRetain", a.cuPrimaryCtxRetain(&ctx, int32(ordinal)))
	must(tb, "cuCtxPushCurrent", a.cuCtxPushCurrent(ctx))
	return func() {
		var c uintptr
		must(tb, "cuCtxPopCurrent", a.cuCtxPopCurrent(&c))
		must(tb, "cuDevicePrimaryCtxRelease", a.cuPrimaryCtxRelease(int32(ordinal)))
	}
}

func must(tb testing.TB, call string, code int32) {
	tb.Helper()
	if code != 0 {
		tb.Fatalf("%s: error %d", call, code)
	}
}

// devMem is device memory made with the driver API: created, reserved,
// mapped and made read-write for its device.
type devMem struct {
	ptr, size uintptr
	h         uint64
}

func prop(ordinal int, types int32, rdma bool) cuda.MemAllocationProp {
	p := cuda.MemAllocationProp{Type: 1, RequestedHandleTypes: types, Location: cuda.MemLocation{Type: 1, ID: int32(ordinal)}}
	if rdma {
		p.GPUDirectRDMACapable = 1
	}
	return p
}

// alloc makes size bytes of exportable device memory on ordinal (a context
// must be current).
func (a *api) alloc(tb testing.TB, ordinal int, size uintptr, rdma bool) devMem {
	tb.Helper()
	m := devMem{size: size}
	p := prop(ordinal, 1, rdma)
	must(tb, "cuMemCreate", a.cuMemCreate(&m.h, size, &p, 0))
	must(tb, "cuMemAddressReserve", a.cuMemAddressReserve(&m.ptr, size, 0, 0, 0))
	must(tb, "cuMemMap", a.cuMemMap(m.ptr, size, 0, m.h, 0))
	access := cuda.MemAccessDesc{Location: p.Location, Flags: 3}
	must(tb, "cuMemSetAccess", a.cuMemSetAccess(m.ptr, size, &access, 1))
	return m
}

func (a *api) free(tb testing.TB, m devMem) {
	tb.Helper()
	must(tb, "cuMemUnmap", a.cuMemUnmap(m.ptr, m.size))
	must(tb, "cuMemAddressFree", a.cuMemAddressFree(m.ptr, m.size))
	must(tb, "cuMemRelease", a.cuMemRelease(m.h))
}

// bytesAt is the n bytes at address p (device memory is host-visible here).
func bytesAt(p, n uintptr) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}

// hostMem is page-aligned host memory outside the Go heap.
func hostMem(tb testing.TB, n int) []byte {
	tb.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// uuidOf is the UUID bytes of physical GPU i.
func uuidOf(i int) [16]byte {
	var u [16]byte
	copy(u[:], fmt.Sprintf("STANDIN-GPU-000%x", i))
	return u
}

// helper runs the helper name in a second process with the stand-in's
// environment plus extra, reporting into its own directory; it returns the
// helper's stdout and the report directory.
func helper(t *testing.T, name string, files []*os.File, extra ...string) (string, string) {
	t.Helper()
	reports := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = Env(os.Getenv(LibDirVar), reports, append([]string{helperVar + "=" + name}, extra...)...)
	cmd.ExtraFiles = files
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper %s: %v\n%s%s", name, err, out, stderr.String())
	}
	return string(out), reports
}

func runHelper(name string) int {
	fn, ok := helpers()[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "no helper %q\n", name)
		return 2
	}
	runtime.LockOSThread()
	a, err := openAPI(os.Getenv(LibDirVar))
	if err == nil {
		err = fn(a)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper %s: %v\n", name, err)
		return 1
	}
	return 0
}

// check turns a non-zero CUDA result into an error naming the call.
func check(call string, code int32) error {
	if code != 0 {
		return fmt.Errorf("%s: error %d", call, code)
	}
	return nil
}
