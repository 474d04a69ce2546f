// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestLoadWithoutDriverSaysSo(t *testing.T) {
	if _, err := os.Stat(DriverVersionFile); err == nil {
		t.Skipf("an NVIDIA driver is present (%s): the no-driver path cannot be tested here", DriverVersionFile)
	}
	_, err := Load()
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Load without a driver: %v, want ErrNoDriver", err)
	}
	if _, err := DriverVersion(); !errors.Is(err, ErrNoDriver) {
		t.Errorf("DriverVersion: %v", err)
	}
	switch c := ProbeCuFile(); {
	case c.Path != "" && (c.Err != nil || !slices.Contains(cufileNames(), c.Path)):
		t.Errorf("ProbeCuFile: loaded %q (not a name it tries) with err %v", c.Path, c.Err)
	case c.Path == "" && (c.Err == nil || !strings.Contains(c.Err.Error(), "libcufile")):
		t.Errorf("ProbeCuFile: no library, and the reason %v does not name the libraries tried", c.Err)
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
