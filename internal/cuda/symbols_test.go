// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRuntimeSymbolsResolve binds every runtime symbol from the real
// libcudart.so.13 of NVIDIA's wheel; without a driver each call returns
// CUDA's own "no driver"/"no device" error, surfaced as an *Error that
// names the call and the error, never a crash.
func TestRuntimeSymbolsResolve(t *testing.T) {
	lib := filepath.Join(cudaWheels(t), "lib", "libcudart.so.13")
	rt, err := LoadRuntime(lib)
	if err != nil {
		t.Fatal(err)
	}
	if rt.entryPoint == nil || rt.memcpy2DAsync == nil {
		t.Errorf("%s: cudaGetDriverEntryPointByVersion or cudaMemcpy2DAsync not bound", lib)
	}
	if _, err := os.Stat(DriverVersionFile); err == nil {
		t.Skipf("an NVIDIA driver is present: the no-driver errors cannot be seen here")
	}
	noDriver := func(call string, err error) {
		t.Helper()
		var ce *Error
		if !errors.As(err, &ce) || (ce.Code != ErrorInsufficientDriver && ce.Code != ErrorNoDevice) || ce.Call != call || ce.Name == "" {
			t.Errorf("%s without a driver: %v, want a CUDA error naming the call and no driver or device", call, err)
		}
	}
	_, err = rt.DeviceCount()
	t.Logf("cudaGetDeviceCount here: %v", err)
	noDriver("cudaGetDeviceCount", err)
	_, _, err = rt.Versions()
	if err == nil {
		d, r, _ := rt.Versions()
		if r == 0 {
			t.Errorf("versions %d %d: no runtime version", d, r)
		}
	}
	_, err = rt.NewThread(0)
	noDriver("cudaSetDevice", errors.Unwrap(err))
	_, err = rt.NewStream()
	noDriver("cudaStreamCreateWithFlags", err)
	if _, err := rt.Driver(); err == nil {
		t.Errorf("driver entry points resolved without a driver")
	}
	if _, err := rt.Devices(); err == nil {
		t.Errorf("devices listed without a driver")
	}
}

// TestCuFileSymbolsResolve binds every cuFile symbol from the real
// libcufile.so.0 of NVIDIA's wheel. Without a driver, opening cuFile is
// an error that names the call and cuFile's code, not a crash.
func TestCuFileSymbolsResolve(t *testing.T) {
	c, err := LoadCuFile(filepath.Join(cudaWheels(t), "lib", "libcufile.so.0"))
	if err != nil {
		t.Fatal(err)
	}
	if c.getVersion == nil || c.errnoLocation == nil || c.driverProps == nil {
		t.Fatalf("cuFileGetVersion, __errno_location or cuFileDriverGetProperties not bound")
	}
	if v, err := c.Version(); err != nil || v < 1150 {
		t.Errorf("cuFileGetVersion without a driver: %d %v, want 1.15 or later", v, err)
	}
	if _, err := os.Stat(DriverVersionFile); err == nil {
		t.Skipf("an NVIDIA driver is present: the no-driver error cannot be seen here")
	}
	err = c.Open()
	t.Logf("cuFileDriverOpen here: %v", err)
	var fe *FileError
	if !errors.As(err, &fe) || fe.Call != "cuFileDriverOpen" || fe.Code <= cuFileBaseErr {
		t.Errorf("cuFile without a driver: %v, want a cuFile error naming cuFileDriverOpen", err)
	}
}

// TestStatsL3Parse reads per-GPU counts from a level-3 statistics block
// laid out as the header says, and the mode each shows.
func TestStatsL3Parse(t *testing.T) {
	b := make([]byte, statsL3Size)
	put := func(gpu, off int, v uint64) {
		p := b[statsL3PerGPU+gpu*perGPUSize+off:]
		for i := range 8 {
			p[i] = byte(v >> (8 * i))
		}
	}
	b[statsL3NumGPUs] = 3
	copy(b[statsL3PerGPU+1*perGPUSize+perGPUUUID:], "STANDIN-GPU-0001")
	put(0, perGPUTotalReads, 10)
	put(0, perGPUP2PReads, 10)
	put(1, perGPUTotalReads, 7)
	put(1, perGPUPosixReads, 7)
	put(2, perGPUNVFSReads, 2)
	put(2, perGPUPosixReads, 1)
	got, err := parseStatsL3(b)
	if err != nil {
		t.Fatal(err)
	}
	if u := "GPU-5354414e-4449-4e2d-4750-552d30303031"; got[1].UUID != u || !SameUUID(got[1].UUID, strings.ToUpper(u[4:])) {
		t.Errorf("GPU 1's UUID %q, want %q", got[1].UUID, u)
	}
	want := []string{"gds", "compat", "mixed"}
	if len(got) != 3 {
		t.Fatalf("%d GPUs, want 3", len(got))
	}
	for i, w := range want {
		if got[i].Mode() != w {
			t.Errorf("GPU %d %+v: mode %s, want %s", i, got[i], got[i].Mode(), w)
		}
	}
	if (GPUReads{}).Mode() != "none" {
		t.Errorf("no reads: mode %s", GPUReads{}.Mode())
	}
	b[statsL3NumGPUs] = 17
	if _, err := parseStatsL3(b); err == nil {
		t.Errorf("17 GPUs (more than the 16 slots): no error")
	}
}

// TestDriverPropsParse reads nvidia-fs's version and the flags from a
// CUfileDrvProps_t laid out as the header says.
func TestDriverPropsParse(t *testing.T) {
	b := make([]byte, drvPropsSize)
	if p := parseDriverProps(b); p.NVFS() {
		t.Errorf("nvfs 0.0: %+v says nvidia-fs is loaded", p)
	}
	b[drvPropsMajor], b[drvPropsMinor], b[drvPropsDStatusFlags+1], b[drvPropsDControlFlags], b[drvPropsFFlags] = 2, 17, 0x08, 0x02, 0x04
	p := parseDriverProps(b)
	if !p.NVFS() || p.NVFSMajor != 2 || p.NVFSMinor != 17 || p.DStatusFlags != 1<<11 || p.DControlFlags != 2 || p.FFlags != 4 {
		t.Errorf("%+v", p)
	}
}
