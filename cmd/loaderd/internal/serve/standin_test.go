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
	req := wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}, Memory: batchmem.GPU, GPUPath: loader.GPUPathBounce, Device: 0, DeviceUUID: gpu0}}
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

// TestStandinDeviceBudget: a GPU session is admitted on what the loader
// plans: its GPU memory (slots rounded up to 2 MiB) against
// --max-device-mb, and its page-locked staging area, as large, against
// --max-locked-mb; status shows both used. A session past the GPU budget
// is 507 naming it, and a closed session gives its share back.
func TestStandinDeviceBudget(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	f := startWith(t, Config{SessionTimeout: time.Minute, MaxDeviceBytes: 3 << 20, MaxLockedBytes: 64 << 20})
	req := wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}, Memory: batchmem.GPU, GPUPath: loader.GPUPathBounce}}
	var open wire.OpenResponse
	if code := f.call(t, "POST", "/v1/sessions", req, &open); code != 200 {
		t.Fatalf("open: %d", code)
	}
	if open.Memory.Size != batchmem.Granularity {
		t.Fatalf("memory %+v: want one granule of GPU memory", open.Memory)
	}
	var st wire.StatusResponse
	if code := f.call(t, "GET", "/v1/status", nil, &st); code != 200 {
		t.Fatalf("status: %d", code)
	}
	used := map[string]int64{}
	for _, b := range st.Budgets {
		used[b.Name] = b.Used
	}
	if used["gpu_batch_memory"] != batchmem.Granularity || used["batch_memory"] != batchmem.Granularity {
		t.Errorf("budgets used %v: want the GPU memory and its staging area, 2 MiB each", used)
	}
	var e wire.ErrorResponse
	if code := f.call(t, "POST", "/v1/sessions", req, &e); code != 507 || !strings.Contains(e.Error, "--max-device-mb") {
		t.Errorf("a second session past the GPU budget: %d %q, want 507 naming --max-device-mb", code, e.Error)
	}
	if code := f.call(t, "DELETE", "/v1/sessions/"+open.ID, nil, nil); code != 200 && code != 204 {
		t.Fatalf("close: %d", code)
	}
	if code := f.call(t, "POST", "/v1/sessions", req, &open); code != 200 {
		t.Errorf("open after the close: %d", code)
	}
}
