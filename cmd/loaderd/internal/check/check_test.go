// SPDX-License-Identifier: Apache-2.0

package check

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

func TestCheckReport(t *testing.T) {
	datasets := map[string]string{}
	fs := testfs.New(t, testfs.Ext4()) // skips, saying why, without root or loop devices
	fs.WriteFile(t, "train/a/x.jpg", bytes.Repeat([]byte{1}, 10000))
	fs.Sync(t)
	m, err := bmap.Build(t.Context(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "train.bmap")
	if _, err := bmap.WriteFile(path, m, bmap.FormatBinary); err != nil {
		t.Fatal(err)
	}
	datasets["train"] = path
	none := cuda.Search{NoLoaderSearch: true}
	r, err := Run(Options{Datasets: datasets, Search: &none})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Datasets) != 1 {
		t.Fatalf("%d datasets reported", len(r.Datasets))
	}
	d := r.Datasets[0]
	if !d.Fresh.OK || !d.ODirect.OK || d.Device != fs.Dev || d.Place.PCIPath != "" || d.RawShare != 1 {
		t.Errorf("dataset: %+v, want a fresh map, O_DIRECT reads, %s as a virtual device, all raw", d, fs.Dev)
	}
	if r.Go == "" || r.Kernel == "" || r.Seccomp == "" {
		t.Errorf("report lacks the basics: %+v", r)
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
		if r.Driver.OK || r.CUDA.OK || len(r.GPUs) != 0 {
			t.Errorf("no driver here, yet: driver %+v cuda %+v gpus %v", r.Driver, r.CUDA, r.GPUs)
		}
		var text bytes.Buffer
		r.WriteText(&text)
		if !strings.Contains(text.String(), "no NVIDIA driver") {
			t.Errorf("text does not say there is no driver:\n%s", text.String())
		}
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back["datasets"] == nil || back["nvidia_driver"] == nil {
		t.Errorf("JSON: %v %s", err, js.String())
	}
	// A map that cannot be loaded fails the check, naming it.
	if _, err := Run(Options{Datasets: map[string]string{"bad": filepath.Join(t.TempDir(), "none.bmap")}}); err == nil || !strings.Contains(err.Error(), "dataset bad") {
		t.Errorf("a missing map file: %v, want an error naming the dataset", err)
	}
}

// venvSearch is the discovery of a process whose VIRTUAL_ENV is the
// project's .venv (NVIDIA's nvidia-cuda-runtime and nvidia-cufile wheels,
// which make test installs), and nothing else; it skips when the venv lacks
// them.
func venvSearch(t *testing.T) (cuda.Search, string) {
	t.Helper()
	venv, err := filepath.Abs("../../../../.venv")
	if err != nil {
		t.Fatal(err)
	}
	libs, _ := filepath.Glob(filepath.Join(venv, "lib/python3*/site-packages/nvidia/cu13/lib/libcufile.so.0"))
	if len(libs) == 0 {
		testenv.SkipPrivileged(t, "NVIDIA's CUDA wheels are not installed in %s", venv)
	}
	return cuda.Search{Getenv: func(k string) string { return map[string]string{"VIRTUAL_ENV": venv}[k] }, NoLoaderSearch: true}, filepath.Dir(libs[0])
}

// TestCheckLibrariesWithoutDriver: with NVIDIA's wheels in the Python
// environment and no driver, the check names each library, the file
// found, how (VIRTUAL_ENV's wheel) and its version, and says "no driver".
func TestCheckLibrariesWithoutDriver(t *testing.T) {
	if _, err := os.Stat(cuda.DriverVersionFile); err == nil {
		t.Skip("an NVIDIA driver is present")
	}
	s, dir := venvSearch(t)
	r, err := Run(Options{Search: &s})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"libcudart": "CUDA runtime 13.", "libcufile": "cuFile 1."}
	if len(r.Libraries) != len(want) {
		t.Fatalf("libraries %+v", r.Libraries)
	}
	for _, l := range r.Libraries {
		if filepath.Dir(l.Path) != dir || l.From != "VIRTUAL_ENV (NVIDIA wheel)" || !strings.HasPrefix(l.Version, want[l.Name]) || l.Error != "" {
			t.Errorf("%+v: want the wheel's file in %s, found by VIRTUAL_ENV, version %s", l, dir, want[l.Name])
		}
	}
	if r.Driver.OK || !strings.Contains(r.Driver.Detail, "no driver") || len(r.CUDADevices) != 0 || !r.CuFile.OK {
		t.Errorf("driver %+v devices %v cufile %+v: want no driver, no devices, cuFile loading", r.Driver, r.CUDADevices, r.CuFile)
	}
	var text bytes.Buffer
	r.WriteText(&text)
	for _, w := range []string{"libcudart", "libcufile", dir, "found by VIRTUAL_ENV (NVIDIA wheel)", "CUDA runtime 13.", "cuFile 1.", "no driver"} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("the text lacks %q:\n%s", w, text.String())
		}
	}
	t.Logf("\n%s", text.String())
}

// TestCheckLibrariesNotFound: with nowhere to look, each library says why
// it was not found and there is no driver to ask.
func TestCheckLibrariesNotFound(t *testing.T) {
	s := cuda.Search{NoLoaderSearch: true}
	r, err := Run(Options{Search: &s})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range r.Libraries {
		if l.Path != "" || !strings.Contains(l.Error, "not found") {
			t.Errorf("%+v: want not found, saying so", l)
		}
	}
	if r.Driver.OK || r.CUDA.OK || r.CuFile.OK {
		t.Errorf("driver %+v cuda %+v cufile %+v", r.Driver, r.CUDA, r.CuFile)
	}
}

// TestCheckTextSaysEachThingOnce: on a node without the CUDA libraries,
// the text names every searched directory once (the search path's own
// line), not in each library's and each probe's reason.
func TestCheckTextSaysEachThingOnce(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	env := map[string]string{cuda.EnvLibDir: dirs[0], "CUDA_HOME": dirs[1]}
	s := cuda.Search{Getenv: func(k string) string { return env[k] }, NoLoaderSearch: true}
	r, err := Run(Options{Search: &s})
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	r.WriteText(&text)
	for _, tc := range []struct {
		what string
		want int
	}{
		{dirs[0], 1},
		{filepath.Join(dirs[1], "lib64"), 1},
		{"libcudart (libcudart.so.13", 1},
		{"libcufile (libcufile.so.0", 1},
	} {
		if n := strings.Count(text.String(), tc.what); n != tc.want {
			t.Errorf("%q appears %d times, want %d:\n%s", tc.what, n, tc.want, text.String())
		}
	}
}
