// SPDX-License-Identifier: Apache-2.0

package check

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
)

// TestCheckWithStandin: with NVFEED_CUDA_LIB_DIR naming the stand-in
// (which has no /proc/driver/nvidia/version), the check says the
// libraries came from there, that there is a driver (the runtime's word),
// and lists the CUDA devices with their UUIDs in this process's order.
func TestCheckWithStandin(t *testing.T) {
	if !standin.InChild(t, "CUDA_VISIBLE_DEVICES=1,0") {
		return
	}
	dir := os.Getenv(cuda.EnvLibDir)
	r, err := Run(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range r.Libraries {
		if filepath.Dir(l.Path) != dir || l.From != cuda.EnvLibDir || l.Version == "" || l.Error != "" {
			t.Errorf("%+v: want the stand-in's in %s, found by %s, with a version", l, dir, cuda.EnvLibDir)
		}
	}
	if !r.Driver.OK || !strings.Contains(r.Driver.Detail, "CUDA 13.0") {
		t.Errorf("driver %+v: want the stand-in's CUDA 13.0", r.Driver)
	}
	if len(r.CUDADevices) != 2 || !strings.HasSuffix(r.CUDADevices[0].UUID, "3031") || !strings.HasSuffix(r.CUDADevices[1].UUID, "3030") {
		t.Errorf("devices %+v: want the stand-in's GPU 1 at ordinal 0, GPU 0 at 1", r.CUDADevices)
	}
	var text bytes.Buffer
	r.WriteText(&text)
	for _, w := range []string{"found by " + cuda.EnvLibDir, "cuda device 0 GPU-", "cuda device 1 GPU-"} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("the text lacks %q:\n%s", w, text.String())
		}
	}
	if strings.Contains(text.String(), "no driver") {
		t.Errorf("the text says no driver:\n%s", text.String())
	}
}
