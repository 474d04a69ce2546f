// SPDX-License-Identifier: Apache-2.0

package loader_test

import (
	"os"
	"testing"
	"unsafe"

	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/backend/backendtest"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestBuiltinsConform runs the conformance suite any backend runs over
// every built-in one: file, and gds and bam on a real ext4 filesystem
// (they read its block device). cufile runs it in
// TestCuFileConformsOnStandin.
func TestBuiltinsConform(t *testing.T) {
	for _, name := range []string{"file", "gds", "bam"} {
		t.Run(name, func(t *testing.T) {
			spec, err := loader.BackendSpec(name)
			if err != nil {
				t.Fatal(err)
			}
			c := backendtest.Config{Spec: spec}
			if name != "file" {
				fs := testfs.New(t, testfs.Ext4())
				c.Dir = func(t *testing.T) string {
					d, err := os.MkdirTemp(fs.Dir, "suite")
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
			}
			backendtest.Run(t, c)
		})
	}
}

// TestCuFileConformsOnStandin runs the conformance suite over the cufile
// backend on the CUDA stand-in (GPU memory over host memory: its bytes
// are read back at their device address).
func TestCuFileConformsOnStandin(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	spec, err := loader.BackendSpec("cufile")
	if err != nil {
		t.Fatal(err)
	}
	mem, err := batchmem.Open(batchmem.GPU, 1, 4<<20, batchmem.Options{DeviceWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	d := mem.Desc()
	backendtest.Run(t, backendtest.Config{
		Spec: spec,
		Dir: func(t *testing.T) string {
			dir := t.TempDir()
			standin.ProvideCuFileHost(t, false, dir)
			return dir
		},
		Device: &backendtest.Device{
			Mem: backend.GPUMemory{Device: d.Device, Base: mem.Slot(0).Dev, Size: d.Size, NUMANode: d.NUMANode},
			Read: func(addr uintptr, n int) []byte { // the stand-in's device memory is host memory
				return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&addr))), n)
			},
		},
	})
}
