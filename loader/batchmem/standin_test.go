// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
)

// standinReport is this process's stand-in report now.
func standinReport(t *testing.T) standin.Report {
	t.Helper()
	rs, err := standin.ReadReports(os.Getenv(standin.ReportVar))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.PID == os.Getpid() {
			return r
		}
	}
	t.Fatalf("no stand-in report of pid %d", os.Getpid())
	return standin.Report{}
}

// standinUUID is the UUID the stand-in gives physical GPU i.
func standinUUID(i int) string {
	var u [16]byte
	copy(u[:], "STANDIN-GPU-000")
	u[15] = "0123456789abcdef"[i]
	return cuda.FormatUUID(u)
}

// TestStandinGPUMemoryByUUID: GPU memory asked for by UUID lands on that
// GPU whatever its ordinal in this process (CUDA_VISIBLE_DEVICES=1,0: GPU 0
// is ordinal 1), says both in its Desc, and its host staging area is
// registered with CUDA on the GPU's own thread (else the stand-in sees a
// runtime call with no device set: an implicit context on device 0) and
// unregistered at Close. A UUID this process does not see is
// ErrUnknownGPU naming the GPUs it sees.
func TestStandinGPUMemoryByUUID(t *testing.T) {
	if !standin.InChild(t, "CUDA_VISIBLE_DEVICES=1,0") {
		return
	}
	m, err := Open(GPU, 3, 1<<20, Options{DeviceUUID: strings.ToUpper(standinUUID(0))})
	if err != nil {
		t.Fatal(err)
	}
	d := m.Desc()
	if d.Kind != GPU || d.Device != 1 || d.UUID != standinUUID(0) || d.Size < 3<<20 {
		t.Errorf("desc %+v, want GPU 0's UUID at ordinal 1", d)
	}
	if m.Slot(0).Host == nil || m.Slot(2).Dev != m.Slot(0).Dev+2<<20 {
		t.Errorf("slots: no staging, or not 1 MiB apart")
	}
	if r := standinReport(t); r.Live["host_registrations"] != 1 || r.Live["allocations"] != 1 {
		t.Errorf("while open: %v, want the staging area registered and one allocation", r.Live)
	}
	f, err := m.Export()
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	byOrdinal, err := Open(GPU, 1, 4096, Options{Device: 0, DeviceWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := byOrdinal.Desc(); d.Device != 0 || d.UUID != standinUUID(1) {
		t.Errorf("by ordinal 0: %+v, want GPU 1's UUID", d)
	}
	byOrdinal.Close()
	_, err = Open(GPU, 1, 4096, Options{DeviceUUID: standinUUID(7)})
	if !errors.Is(err, ErrUnknownGPU) || !strings.Contains(err.Error(), standinUUID(7)) || !strings.Contains(err.Error(), "0: "+standinUUID(1)) || !strings.Contains(err.Error(), "1: "+standinUUID(0)) {
		t.Errorf("an unknown UUID: %v, want ErrUnknownGPU naming it and the GPUs here", err)
	}
}

// TestStandinPinnedMakesNoContext: pinned host memory is not registered
// with CUDA, so a session without a GPU makes no CUDA context (before, a
// registration from a thread with no device set made one on GPU 0 in
// every process).
func TestStandinPinnedMakesNoContext(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	if _, err := cuda.Load(); err != nil { // the stand-in loaded and reporting, as in a daemon with a GPU
		t.Fatal(err)
	}
	m, err := Open(Pinned, 2, 1<<20, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := standinReport(t); r.Live["host_registrations"] != 0 || r.RuntimeContexts != 0 || r.Live["primary_ctx_retains"] != 0 {
		t.Errorf("pinned memory open: %+v, want no registration and no context", r)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
