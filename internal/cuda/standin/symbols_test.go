// SPDX-License-Identifier: Apache-2.0

package standin

import (
	"debug/elf"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
)

// exported lists the functions a shared library exports.
func exported(t *testing.T, path string) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			out = append(out, strings.SplitN(s.Name, "@", 2)[0])
		}
	}
	return out
}

// realCuFileResolves are the driver functions NVIDIA's libcufile.so.0
// (cuFile 1.15, the nvidia-cufile wheel) looks up in libcuda.so.1 at
// cuFileDriverOpen (a breakpoint on dlsym while it opened over the
// stand-in); one missing and it refuses to start ("missing cuda symbols
// while dynamic loading", 5033).
var realCuFileResolves = []string{
	"cuCtxCreate_v2", "cuCtxDestroy_v2", "cuCtxEnablePeerAccess", "cuCtxGetCurrent", "cuCtxGetDevice",
	"cuCtxGetStreamPriorityRange", "cuCtxPopCurrent_v2", "cuCtxPushCurrent_v2", "cuCtxSetCurrent",
	"cuDeviceCanAccessPeer", "cuDeviceGet", "cuDeviceGetAttribute", "cuDeviceGetCount", "cuDeviceGetName",
	"cuDeviceGetUuid_v2", "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRetain", "cuDriverGetVersion",
	"cuEventCreate", "cuEventDestroy_v2", "cuEventElapsedTime", "cuEventQuery", "cuEventRecord", "cuEventSynchronize",
	"cuGetErrorName", "cuGetExportTable", "cuInit", "cuIpcCloseMemHandle", "cuIpcGetEventHandle", "cuIpcGetMemHandle",
	"cuIpcOpenEventHandle", "cuIpcOpenMemHandle_v2", "cuLaunchHostFunc", "cuMemAllocHost_v2", "cuMemAllocManaged",
	"cuMemAlloc_v2", "cuMemFreeHost", "cuMemFree_v2", "cuMemGetAddressRange_v2", "cuMemGetHandleForAddressRange",
	"cuMemHostAlloc", "cuMemHostGetDevicePointer_v2", "cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemcpy",
	"cuMemcpyAsync", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoH_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoD_v2",
	"cuMemcpyPeer", "cuMemcpyPeerAsync", "cuMemsetD8Async", "cuMemsetD8_v2", "cuPointerGetAttribute",
	"cuPointerGetAttributes", "cuPointerSetAttribute", "cuStreamCreate", "cuStreamCreateWithPriority",
	"cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamWaitEvent", "cuStreamWaitValue32", "cuStreamWaitValue32_v2",
	"cuStreamWriteValue32", "cuStreamWriteValue32_v2",
}

// TestSymbols: the stand-in exports what the project and its fixes call,
// including every driver function the Python client names and every one
// NVIDIA's libcufile resolves (python/tests/test_real_cufile.py runs it
// over the stand-in).
func TestSymbols(t *testing.T) {
	dir := os.Getenv(LibDirVar)
	want := map[string][]string{
		Driver: {"cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetUuid", "cuDeviceGetUuid_v2",
			"cuDeviceGetAttribute", "cuDeviceGetPCIBusId", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2",
			"cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxSetCurrent", "cuCtxGetCurrent", "cuCtxSynchronize",
			"cuStreamCreate", "cuStreamDestroy_v2", "cuStreamSynchronize", "cuStreamWaitEvent", "cuEventCreate",
			"cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuEventDestroy_v2", "cuMemcpyHtoD_v2",
			"cuMemcpyDtoH_v2", "cuGetErrorName", "cuGetErrorString", "cuStandinLaunchRead", "cuStandinReport"},
		Runtime: {"cudaDeviceGetAttribute", "cudaMemcpy2DAsync", "cudaGetDeviceCount", "cudaGetDriverEntryPointByVersion"},
		CuFile:  {"cuFileDriverGetProperties", "cuFileDriverClose", "cuFileDriverClose_v2"},
	}
	want[Driver] = append(want[Driver], realCuFileResolves...)
	py, err := filepath.Glob("../../../python/nvfeed/*.py")
	if err != nil || len(py) == 0 {
		t.Fatalf("the Python client's sources: %v", err)
	}
	for _, p := range py {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`\bcu[A-Z][A-Za-z0-9_]*`).FindAllString(string(b), -1) {
			if !strings.HasPrefix(m, "cuFile") {
				want[Driver] = append(want[Driver], m)
			}
		}
	}
	for lib, names := range want {
		have := exported(t, filepath.Join(dir, lib))
		for _, name := range names {
			if !slices.Contains(have, name) {
				t.Errorf("%s does not export %s", lib, name)
			}
		}
	}
}

// TestSymbolsAreNVIDIAs: every function the stand-in exports (its hooks and
// internal API aside) is one of the real library's (libcudart.so.13 and
// libcufile.so.0 of NVIDIA's wheels) or, for the driver, declared by cuda.h.
func TestSymbolsAreNVIDIAs(t *testing.T) {
	wheels := nvidiaWheels(t)
	header, err := os.ReadFile(filepath.Join(wheels, "include", "cuda.h"))
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv(LibDirVar)
	for _, lib := range []string{Driver, Runtime, CuFile} {
		var real []string
		if lib != Driver {
			real = exported(t, filepath.Join(wheels, "lib", lib))
		}
		for _, name := range exported(t, filepath.Join(dir, lib)) {
			switch {
			case strings.HasPrefix(name, "standin_") || strings.HasPrefix(name, "cuStandin"):
			case lib == Driver && !regexp.MustCompile(`\b`+name+`\b`).Match(header):
				t.Errorf("%s: %s is not declared by cuda.h", lib, name)
			case lib != Driver && !slices.Contains(real, name):
				t.Errorf("%s: %s is not exported by NVIDIA's %s", lib, name, lib)
			}
		}
	}
	// The hooks are found by dlsym, as a test would.
	h, err := purego.Dlopen(filepath.Join(dir, Driver), purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"cuStandinLaunchRead", "cuStandinReport"} {
		if _, err := purego.Dlsym(h, hook); err != nil {
			t.Error(err)
		}
	}
}
