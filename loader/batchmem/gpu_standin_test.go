// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/cuda/standin"
)

// standinChild marks the child process TestGPUStandin runs itself in.
const standinChild = "NVFEED_BATCHMEM_STANDIN_CHILD"

// TestGPUStandin runs the placement cases on GPU memory as a real GPU
// makes it (cudaDevice: libcudart through the library discovery, a locked
// thread, a stream, events, cudaMemcpyAsync, cudaMemcpy2DAsync,
// cudaMemsetAsync), over the strict CUDA stand-in: in a child process,
// whose device memory is read back through its exported descriptor and
// whose report must show no broken rule and nothing left allocated,
// mapped or registered once it closed the memory.
func TestGPUStandin(t *testing.T) {
	if os.Getenv(standinChild) == "" {
		dir, reports := standin.Build(t), t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestGPUStandin$", "-test.v", "-test.count=1")
		cmd.Env = standin.Env(dir, reports, standinChild+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestGPUStandin") {
			t.Fatalf("the child on the stand-in: %v\n%s", err, out)
		}
		standin.CheckClean(t, reports)
		return
	}
	testPlacements(t, func(t *testing.T, deviceWrites bool) (Memory, []byte, func() []fakeOp) {
		m, err := Open(GPU, 2, placementSlot, Options{Device: 0, DeviceWrites: deviceWrites})
		if err != nil {
			t.Fatal(err)
		}
		f, err := m.Export()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		view, err := unix.Mmap(int(f.Fd()), 0, int(m.Desc().Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatalf("mapping the stand-in's exported device memory: %v", err)
		}
		t.Cleanup(func() { unix.Munmap(view) })
		return m, view, nil
	})
}
