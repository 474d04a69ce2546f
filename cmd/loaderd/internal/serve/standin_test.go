// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/batchmem"
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

// TestStandinDeviceUUID: a session asks for its GPU by UUID and gets the
// daemon's ordinal for it (the daemon sees the GPUs in another order:
// CUDA_VISIBLE_DEVICES=1,0), with the UUID in the memory's description; a
// UUID the daemon does not see is 400 naming it and the GPUs it sees.
func TestStandinDeviceUUID(t *testing.T) {
	if !withStandin(t, "CUDA_VISIBLE_DEVICES=1,0") {
		return
	}
	f := start(t, time.Minute)
	const gpu0 = "GPU-5354414e-4449-4e2d-4750-552d30303030" // physical GPU 0: the daemon's ordinal 1
	var open wire.OpenResponse
	req := wire.OpenRequest{ReaderArgs: loader.ReaderArgs{BatchSize: 4}, Dataset: "ds", Memory: batchmem.GPU, GPUPath: loader.GPUPathBounce, Device: 0, DeviceUUID: gpu0}
	if code := f.call(t, "POST", "/v1/sessions", req, &open); code != 200 {
		t.Fatalf("open on %s: %d", gpu0, code)
	}
	if open.Memory.Device != 1 || open.Memory.UUID != gpu0 {
		t.Errorf("memory %+v: want the daemon's ordinal 1 for %s", open.Memory, gpu0)
	}
	if code := f.call(t, "DELETE", "/v1/sessions/"+open.ID, nil, nil); code != 200 && code != 204 {
		t.Errorf("close: %d", code)
	}
	var e wire.ErrorResponse
	req.DeviceUUID = "GPU-00000000-1111-2222-3333-444444444444"
	code := f.call(t, "POST", "/v1/sessions", req, &e)
	if code != 400 || !strings.Contains(e.Error, req.DeviceUUID) || !strings.Contains(e.Error, "0: GPU-5354414e-4449-4e2d-4750-552d30303031") || !strings.Contains(e.Error, "1: "+gpu0) {
		t.Errorf("an unknown GPU: %d %q, want 400 naming it and the daemon's GPUs", code, e.Error)
	}
}
