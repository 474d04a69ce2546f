package cuda

import (
	"errors"
	"os"
	"path/filepath"
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
	if rt.entryPoint == nil {
		t.Errorf("%s: cudaGetDriverEntryPointByVersion not bound", lib)
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
}
