// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLoadWithoutDriverSaysSo: without a driver Load fails with
// ErrNoDriver, whether no runtime is found at all or NVIDIA's wheel's
// runtime is (which then says itself that it has no driver, naming where
// it was found).
func TestLoadWithoutDriverSaysSo(t *testing.T) {
	if _, err := os.Stat(DriverVersionFile); err == nil {
		t.Skipf("an NVIDIA driver is present (%s): the no-driver path cannot be tested here", DriverVersionFile)
	}
	wheels, err := filepath.Abs(cudaWheels(t))
	if err != nil {
		t.Fatal(err)
	}
	venv := filepath.Clean(filepath.Join(wheels, "../../../../..")) // .venv/lib/python3.X/site-packages/nvidia/cu13
	for _, tc := range []struct {
		name    string
		env     map[string]string
		runtime bool // a runtime is found
		from    string
	}{
		{"nothing", map[string]string{}, false, ""},
		{"wheels", map[string]string{"VIRTUAL_ENV": venv}, true, "VIRTUAL_ENV (NVIDIA wheel)"},
		{"explicit", map[string]string{EnvLibDir: filepath.Join(wheels, "lib")}, true, EnvLibDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Search{Getenv: func(k string) string { return tc.env[k] }, NoLoaderSearch: true}
			_, err := LoadFrom(s)
			if !errors.Is(err, ErrNoDriver) || errors.Is(err, ErrNoRuntime) == tc.runtime {
				t.Fatalf("Load without a driver: %v, want ErrNoDriver (and ErrNoRuntime: %v)", err, !tc.runtime)
			}
			if !tc.runtime {
				return
			}
			if !strings.Contains(err.Error(), wheels) || !strings.Contains(err.Error(), tc.from) {
				t.Errorf("%v: does not name the runtime found in %s and how (%s)", err, wheels, tc.from)
			}
			r, err := OpenRuntime(s)
			if err != nil {
				t.Fatal(err)
			}
			if v, err := r.RuntimeVersion(); err != nil || v < 12000 {
				t.Errorf("the runtime's version without a driver: %d %v", v, err)
			}
			c := ProbeCuFile(s)
			if c.Err != nil || c.Found.From != tc.from || filepath.Dir(c.Found.Path) != filepath.Join(wheels, "lib") || c.Version < 1000 {
				t.Errorf("ProbeCuFile: %+v, want the wheel's libcufile found by %s with its version", c, tc.from)
			}
		})
	}
	if _, err := DriverVersion(); !errors.Is(err, ErrNoDriver) {
		t.Errorf("DriverVersion: %v", err)
	}
}

func TestLoadWithDriver(t *testing.T) {
	if _, err := os.Stat(DriverVersionFile); err != nil {
		t.Skipf("no NVIDIA driver here (%v): runs on a GPU machine", err)
	}
	r, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	d, rt, err := r.Versions()
	if err != nil || d == 0 || rt == 0 {
		t.Fatalf("versions %d %d %v", d, rt, err)
	}
	n, err := r.DeviceCount()
	if err != nil || n < 1 {
		t.Fatalf("devices %d %v", n, err)
	}
	mem := make([]byte, 1<<20)
	if err := r.HostRegister(mem); err != nil {
		t.Fatal(err)
	}
	if err := r.HostUnregister(mem); err != nil {
		t.Fatal(err)
	}
}

func TestFormatVersion(t *testing.T) {
	for v, want := range map[int]string{13000: "13.0", 12040: "12.4", 11080: "11.8"} {
		if got := FormatVersion(v); got != want {
			t.Errorf("%d: %s, want %s", v, got, want)
		}
	}
}
