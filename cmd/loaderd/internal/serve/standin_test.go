// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestStandinDeviceUUID: a session asks for its GPU by UUID and gets the
// daemon's ordinal for it (the daemon sees the GPUs in another order:
// CUDA_VISIBLE_DEVICES=1,0), with the UUID in the memory's description; a
// UUID the daemon does not see is 400 naming it and the GPUs it sees.
func TestStandinDeviceUUID(t *testing.T) {
	if !standin.InChild(t, "CUDA_VISIBLE_DEVICES=1,0") {
		return
	}
	f := start(t, time.Minute)
	const gpu0 = "GPU-5354414e-4449-4e2d-4750-552d30303030" // physical GPU 0: the daemon's ordinal 1
	var open wire.OpenResponse
	req := wire.OpenRequest{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}, Dataset: "ds", Memory: batchmem.GPU, GPUPath: loader.GPUPathBounce, Device: 0, DeviceUUID: gpu0}
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
