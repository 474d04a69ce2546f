// SPDX-License-Identifier: Apache-2.0

// Package cuda loads the NVIDIA CUDA runtime (libcudart) and cuFile
// (libcufile) at run time with purego: no CUDA headers or libraries at
// build time, no cgo, and a build that runs unchanged on machines without
// a driver, where Load says so plainly.
//
// Only what this project calls is bound: versions and devices, host
// registration (cudaHostRegister, portable) so that copies from batch
// memory to a GPU are DMA, streams, events and host-to-device copies
// (runtime.go), exportable device memory through the driver's virtual
// memory management API, reached through the runtime's driver entry points
// (vmm.go), a locked OS thread to make every call on (thread.go), and
// cuFile (cufile.go). The C structs mirrored here are checked against
// NVIDIA's headers by abi_test.go, and every bound symbol against the real
// libraries by symbols_test.go.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNoDriver is returned (wrapped) by Load on a machine without an NVIDIA
// driver (no /proc/driver/nvidia/version).
var ErrNoDriver = errors.New("no NVIDIA driver found")

// ErrNoRuntime is returned (wrapped) by Load when the driver is present but
// no libcudart can be loaded.
var ErrNoRuntime = errors.New("no CUDA runtime (libcudart) found")

// DriverVersionFile is where the kernel module reports itself.
const DriverVersionFile = "/proc/driver/nvidia/version"

// Library names tried, newest first.
func cudartNames() []string {
	return []string{"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}
}

func cufileNames() []string { return []string{"libcufile.so", "libcufile.so.0"} }

// Runtime is a loaded libcudart.
type Runtime struct {
	Path string // the library loaded

	driverGetVersion  func(*int32) int32
	runtimeGetVersion func(*int32) int32
	getDeviceCount    func(*int32) int32
	hostRegister      func(unsafe.Pointer, uintptr, uint32) int32
	hostUnregister    func(unsafe.Pointer) int32
	getErrorString    func(int32) string
	getErrorName      func(int32) string
	setDevice         func(int32) int32
	streamCreate      func(*uintptr, uint32) int32
	streamDestroy     func(uintptr) int32
	eventCreate       func(*uintptr, uint32) int32
	eventRecord       func(uintptr, uintptr) int32
	eventSynchronize  func(uintptr) int32
	eventDestroy      func(uintptr) int32
	memcpyAsync       func(dst, src, n uintptr, kind int32, stream uintptr) int32
	memcpy2DAsync     func(dst, dpitch, src, spitch, width, height uintptr, kind int32, stream uintptr) int32 // copy2d.go
	memsetAsync       func(dst uintptr, value int32, n, stream uintptr) int32                                 // copy2d.go
	pciBusID          func(buf *byte, n int32, device int32) int32
	entryPoint        func(symbol string, fn *uintptr, version uint32, flags uint64, status *int32) int32
}

// runtimeSymbols are the libcudart functions Runtime binds, by name.
func (r *Runtime) runtimeSymbols() map[string]any {
	return map[string]any{
		"cudaDriverGetVersion": &r.driverGetVersion, "cudaRuntimeGetVersion": &r.runtimeGetVersion,
		"cudaGetDeviceCount": &r.getDeviceCount, "cudaHostRegister": &r.hostRegister,
		"cudaHostUnregister": &r.hostUnregister, "cudaGetErrorString": &r.getErrorString,
		"cudaGetErrorName": &r.getErrorName, "cudaSetDevice": &r.setDevice,
		"cudaStreamCreateWithFlags": &r.streamCreate, "cudaStreamDestroy": &r.streamDestroy,
		"cudaEventCreateWithFlags": &r.eventCreate, "cudaEventRecord": &r.eventRecord,
		"cudaEventSynchronize": &r.eventSynchronize, "cudaEventDestroy": &r.eventDestroy,
		"cudaMemcpyAsync": &r.memcpyAsync, "cudaDeviceGetPCIBusId": &r.pciBusID,
		"cudaMemcpy2DAsync": &r.memcpy2DAsync, "cudaMemsetAsync": &r.memsetAsync,
	}
}

// optionalSymbols are bound where the library has them:
// cudaGetDriverEntryPointByVersion came with CUDA 12.5 (device memory
// needs it; host registration does not).
func (r *Runtime) optionalSymbols() map[string]any {
	return map[string]any{"cudaGetDriverEntryPointByVersion": &r.entryPoint}
}

// DriverVersion returns the first line of the kernel module's version
// file, or ErrNoDriver.
func DriverVersion() (string, error) {
	b, err := os.ReadFile(DriverVersionFile)
	if err != nil {
		return "", fmt.Errorf("cuda: %w (%s: %v)", ErrNoDriver, DriverVersionFile, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), nil
}

// Load loads libcudart. Without a driver it fails with ErrNoDriver before
// trying any library.
func Load() (*Runtime, error) {
	if _, err := DriverVersion(); err != nil {
		return nil, err
	}
	lib, path, err := open(cudartNames())
	if err != nil {
		return nil, fmt.Errorf("cuda: %w: %v", ErrNoRuntime, err)
	}
	return bindRuntime(lib, path)
}

// LoadRuntime loads the libcudart at path whether or not a driver is
// present: for tests of the bindings against a real library, whose calls
// then fail with CUDA's own "no driver" errors.
func LoadRuntime(path string) (*Runtime, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w: %s: %v", ErrNoRuntime, path, err)
	}
	return bindRuntime(lib, path)
}

func bindRuntime(lib uintptr, path string) (*Runtime, error) {
	r := &Runtime{Path: path}
	if err := bind(lib, path, r.runtimeSymbols()); err != nil {
		return nil, err
	}
	for name, fn := range r.optionalSymbols() {
		if sym, err := purego.Dlsym(lib, name); err == nil {
			purego.RegisterFunc(fn, sym)
		}
	}
	return r, nil
}

// bind resolves every symbol of fns in lib into its function variable.
func bind(lib uintptr, path string, fns map[string]any) error {
	for name, fn := range fns {
		sym, err := purego.Dlsym(lib, name)
		if err != nil {
			return fmt.Errorf("cuda: %s: %s: %w", path, name, err)
		}
		purego.RegisterFunc(fn, sym)
	}
	return nil
}

// open dlopens the first of names that loads.
func open(names []string) (uintptr, string, error) {
	var errs []string
	for _, n := range names {
		lib, err := purego.Dlopen(n, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err == nil {
			return lib, n, nil
		}
		errs = append(errs, err.Error())
	}
	return 0, "", errors.New(strings.Join(errs, "; "))
}

// Error is a CUDA runtime or driver error: the call, the code, its name
// (cudaErrorNoDevice, CUDA_ERROR_OUT_OF_MEMORY) and its message.
type Error struct {
	Call string
	Code int32
	Name string
	Msg  string
}

// Error returns "CALL: NAME (CODE): MESSAGE".
func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Msg)
}

// Runtime error codes callers branch on.
const (
	ErrorInsufficientDriver int32 = 35  // cudaErrorInsufficientDriver
	ErrorNoDevice           int32 = 100 // cudaErrorNoDevice
)

func (r *Runtime) check(call string, code int32) error {
	if code == 0 {
		return nil
	}
	return &Error{Call: call, Code: code, Name: r.getErrorName(code), Msg: r.getErrorString(code)}
}

// Versions returns the CUDA driver and runtime versions as 1000·major +
// 10·minor (CUDA's encoding).
func (r *Runtime) Versions() (driver, runtime int, err error) {
	var d, rt int32
	if err := r.check("cudaDriverGetVersion", r.driverGetVersion(&d)); err != nil {
		return 0, 0, err
	}
	if err := r.check("cudaRuntimeGetVersion", r.runtimeGetVersion(&rt)); err != nil {
		return 0, 0, err
	}
	return int(d), int(rt), nil
}

// FormatVersion renders CUDA's version encoding as "major.minor".
func FormatVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// DeviceCount returns the number of CUDA devices.
func (r *Runtime) DeviceCount() (int, error) {
	var n int32
	if err := r.check("cudaGetDeviceCount", r.getDeviceCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// HostRegister page-locks mem for CUDA (portable: every context), so that
// copies from it to a GPU are DMA. mem must stay mapped until
// HostUnregister.
func (r *Runtime) HostRegister(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return r.check("cudaHostRegister", r.hostRegister(unsafe.Pointer(&mem[0]), uintptr(len(mem)), hostRegisterPortable))
}

// HostUnregister undoes HostRegister.
func (r *Runtime) HostUnregister(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return r.check("cudaHostUnregister", r.hostUnregister(unsafe.Pointer(&mem[0])))
}

// CuFile says whether libcufile loads and, when it does, which.
type CuFile struct {
	Path string // the library loaded, "" when none
	Err  error  // why none loaded
}

// ProbeCuFile tries to load libcufile. It does not open a cuFile driver
// session: whether cuFile would run in GDS (nvidia-fs, P2PDMA) or
// compatibility mode needs a GPU and is reported by a GPU session.
func ProbeCuFile() CuFile {
	lib, path, err := open(cufileNames())
	if err != nil {
		return CuFile{Err: err}
	}
	purego.Dlclose(lib)
	return CuFile{Path: path}
}
