// SPDX-License-Identifier: Apache-2.0

package check

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
)

// standinTestVar names the test a re-executed test binary runs with the
// CUDA stand-in loaded.
const standinTestVar = "NVFEED_STANDIN_TEST"

// withStandin runs the calling test again in a child of this test binary
// whose environment loads the CUDA stand-in with the settings extra (read
// once, when it loads), and checks that the child passed and that the
// stand-in saw no broken rule and nothing held at the end. In the child
// it returns true: the test does its work there.
func withStandin(t *testing.T, extra ...string) bool {
	t.Helper()
	if os.Getenv(standinTestVar) == t.Name() {
		return true
	}
	dir := standin.Build(t)
	reports := t.TempDir()
	var pat []string
	for _, p := range strings.Split(t.Name(), "/") {
		pat = append(pat, "^"+regexp.QuoteMeta(p)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pat, "/"), "-test.count=1", "-test.v")
	cmd.Env = standin.Env(dir, reports, append([]string{standinTestVar + "=" + t.Name()}, extra...)...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("with the stand-in (%s): %v\n%s", strings.Join(extra, " "), err, out)
	}
	t.Logf("with the stand-in (%s):\n%s", strings.Join(extra, " "), out)
	standin.CheckClean(t, reports)
	return false
}

// TestCheckWithStandin: with NVFEED_CUDA_LIB_DIR naming the stand-in
// (which has no /proc/driver/nvidia/version), the check says the
// libraries came from there, that there is a driver (the runtime's word),
// and lists the CUDA devices with their UUIDs in this process's order.
func TestCheckWithStandin(t *testing.T) {
	if !withStandin(t, "CUDA_VISIBLE_DEVICES=1,0") {
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
