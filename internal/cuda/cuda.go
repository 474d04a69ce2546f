// SPDX-License-Identifier: Apache-2.0

// Package cuda loads libcudart and libcufile at run time with purego: no headers, no cgo.
// It runs on machines without a driver, where Load says so plainly.
// discover.go finds the libraries; the runtime itself says whether a driver is present.
//
// Only what this project calls is bound: versions and devices, host registration,
// streams, events and copies (runtime.go), device queries, exportable memory (vmm.go),
// a locked OS thread for every call (thread.go), and cuFile (cufile.go).
//
// abi_test.go checks the mirrored C structs against NVIDIA's headers.
// symbols_test.go checks every bound symbol against the real libraries.
package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrNoDriver is returned (wrapped) by Load on a machine without an NVIDIA
// driver: the runtime loaded says so (cudaDriverGetVersion gives 0 or
// cudaErrorInsufficientDriver), or no runtime loads and the kernel module
// is absent too.
var ErrNoDriver = errors.New("no NVIDIA driver found")

// ErrNoRuntime is returned (wrapped) by Load when no libcudart can be
// loaded.
var ErrNoRuntime = errors.New("no CUDA runtime (libcudart) found")

// DriverVersionFile is where the kernel module reports itself.
const DriverVersionFile = "/proc/driver/nvidia/version"

// Runtime is a loaded libcudart.
type Runtime struct {
	Path  string // the library loaded (Found.Path)
	Found Found  // where it was found and how

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
	memcpy2DAsync     func(dst, dpitch, src, spitch, width, height uintptr, kind int32, stream uintptr) int32
	memsetAsync       func(dst uintptr, value int32, n, stream uintptr) int32 // ondevice.go
	pciBusID          func(buf *byte, n int32, device int32) int32
	entryPoint        func(symbol string, fn *uintptr, version uint32, flags uint64, status *int32) int32

	driverOnce sync.Once // resolves driver, driverErr
	driver     *Driver
	driverErr  error
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
		"cudaMemcpyAsync": &r.memcpyAsync, "cudaMemcpy2DAsync": &r.memcpy2DAsync,
		"cudaDeviceGetPCIBusId": &r.pciBusID, "cudaMemsetAsync": &r.memsetAsync,
	}
}

// optionalSymbols are bound where the library has them:
// cudaGetDriverEntryPointByVersion came with CUDA 12.5 (device memory
// and the driver's device queries need it; host registration does not).
func (r *Runtime) optionalSymbols() map[string]any {
	return map[string]any{"cudaGetDriverEntryPointByVersion": &r.entryPoint}
}

// DriverVersion returns the first line of the kernel module's version
// file, or ErrNoDriver. It is a finding for reports: whether CUDA has a
// driver is decided by the runtime (Runtime.DriverVersion), which also
// knows drivers without this file.
func DriverVersion() (string, error) {
	b, err := os.ReadFile(DriverVersionFile)
	if err != nil {
		return "", fmt.Errorf("cuda: %w (%s: %v)", ErrNoDriver, DriverVersionFile, err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), nil
}

// Load finds and loads libcudart (SearchFromEnv) and checks that it has a
// driver: without one it fails with ErrNoDriver, naming the library that
// said so.
func Load() (*Runtime, error) { return LoadFrom(SearchFromEnv()) }

// LoadFrom is Load with the places to search.
func LoadFrom(s Search) (*Runtime, error) {
	r, err := OpenRuntime(s)
	if err != nil {
		return nil, err
	}
	if _, err := r.DriverVersion(); err != nil {
		return nil, err
	}
	return r, nil
}

// OpenRuntime finds and loads libcudart whether or not a driver is
// present (loaderd check reports its version either way). When none
// loads it fails with ErrNoRuntime, and with ErrNoDriver too where the
// kernel module is absent.
func OpenRuntime(s Search) (*Runtime, error) {
	lib, found, err := s.open(Cudart())
	if err != nil {
		if _, derr := DriverVersion(); derr != nil {
			return nil, fmt.Errorf("cuda: %w and %w: %v", ErrNoDriver, ErrNoRuntime, err)
		}
		return nil, fmt.Errorf("cuda: %w: %v", ErrNoRuntime, err)
	}
	return bindRuntime(lib, found)
}

// LoadRuntime loads the libcudart at path whether or not a driver is
// present: for tests of the bindings against a real library, whose calls
// then fail with CUDA's own "no driver" errors.
func LoadRuntime(path string) (*Runtime, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w: %s: %v", ErrNoRuntime, path, err)
	}
	return bindRuntime(lib, Found{Path: path, From: "given"})
}

func bindRuntime(lib uintptr, found Found) (*Runtime, error) {
	r := &Runtime{Path: found.Path, Found: found}
	if err := bind(lib, found.Path, r.runtimeSymbols()); err != nil {
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
// 10·minor (CUDA's encoding); driver is 0 without a driver.
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

// RuntimeVersion returns the runtime's version (CUDA's encoding); it
// needs no driver.
func (r *Runtime) RuntimeVersion() (int, error) {
	var v int32
	if err := r.check("cudaRuntimeGetVersion", r.runtimeGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DriverVersion returns the CUDA version the driver supports, as the
// runtime sees it, or ErrNoDriver when the runtime finds none
// (cudaDriverGetVersion gives 0, or cudaErrorInsufficientDriver): the one
// test of "a driver here" that holds wherever libcuda comes from.
func (r *Runtime) DriverVersion() (int, error) {
	var d int32
	code := r.driverGetVersion(&d)
	switch {
	case code == ErrorInsufficientDriver:
		return 0, fmt.Errorf("cuda: %w: %s says %w", ErrNoDriver, r.Found, r.check("cudaDriverGetVersion", code))
	case code != 0:
		return 0, r.check("cudaDriverGetVersion", code)
	case d == 0:
		return 0, fmt.Errorf("cuda: %w: %s reports driver version 0 (cudaDriverGetVersion)", ErrNoDriver, r.Found)
	}
	return int(d), nil
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
// HostUnregister. Call it on a Thread: on a thread with no device set the
// runtime would silently make a context on device 0.
func (r *Runtime) HostRegister(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return r.check("cudaHostRegister", r.hostRegister(unsafe.Pointer(&mem[0]), uintptr(len(mem)), hostRegisterPortable))
}

// HostUnregister undoes HostRegister, on a Thread too.
func (r *Runtime) HostUnregister(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	return r.check("cudaHostUnregister", r.hostUnregister(unsafe.Pointer(&mem[0])))
}
