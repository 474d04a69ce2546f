// SPDX-License-Identifier: Apache-2.0

package cufile

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/numa"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// cuFileReader is reader on a real GPU: one locked thread per worker with
// the GPU current, the batch memory registered once.
type cuFileReader struct {
	lib     *cuda.CuFileLib
	mem     backend.GPUMemory
	threads []*cuda.Thread
}

// openCuFile loads libcufile, opens its driver (left open for the
// process's life, as KvikIO does: the driver is process-wide and shared by
// every session) and registers mem.
func openCuFile(mem backend.GPUMemory, workers int, log *slog.Logger) (*cuFileReader, error) {
	rt, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	lib, err := cuda.LoadCuFile("")
	if err != nil {
		return nil, err
	}
	c := &cuFileReader{lib: lib, mem: mem}
	for range workers {
		t, err := rt.NewThread(mem.Device)
		if err != nil {
			c.stop()
			return nil, err
		}
		c.threads = append(c.threads, t)
		if mem.NUMANode >= 0 { // the readers on the GPU's node
			cpus, err := numa.CPUs(numa.SysFS, mem.NUMANode)
			if err == nil {
				err = t.Pin(cpus)
			}
			if err != nil {
				log.Warn("cufile: a reader is not on the GPU's NUMA node", "gpu", mem.Device, "node", mem.NUMANode, "err", err)
			}
		}
	}
	err = c.threads[0].Do(func() error {
		if err := lib.Open(); err != nil {
			var fe *cuda.FileError
			if !errors.As(err, &fe) || fe.Name() != "CU_FILE_DRIVER_ALREADY_OPEN" {
				return err
			}
		}
		return lib.RegisterBuffer(mem.Base, mem.Size)
	})
	if err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// Read registers fd, reads into dst (at its offset in the registered
// memory) and deregisters, on worker's thread.
func (c *cuFileReader) Read(worker, fd int, dst uintptr, size int64) (int64, error) {
	if dst < c.mem.Base || int64(dst-c.mem.Base)+size > c.mem.Size {
		return 0, fmt.Errorf("cufile: destination %#x+%d outside the batch memory [%#x, +%d)", dst, size, c.mem.Base, c.mem.Size)
	}
	var n int64
	err := c.threads[worker].Do(func() error {
		h, err := c.lib.RegisterFile(fd)
		if err != nil {
			return err
		}
		defer c.lib.DeregisterFile(h)
		n, err = c.lib.Read(h, c.mem.Base, size, 0, int64(dst-c.mem.Base))
		return err
	})
	return n, err
}

// Stats reads cuFile's level-3 statistics for the GPU.
func (c *cuFileReader) Stats() (string, int64, int64) {
	var reads []cuda.GPUReads
	err := c.threads[0].Do(func() error {
		var err error
		reads, err = c.lib.Reads()
		return err
	})
	i := c.mem.Device
	if len(reads) == 1 { // one GPU seen: it is ours
		i = 0
	}
	if err != nil || i >= len(reads) {
		return "unknown", 0, 0
	}
	r := reads[i] // with several GPUs, cuFile's order is taken to be CUDA's ordinals

	return r.Mode(), int64(r.P2P + r.NVFS), int64(r.POSIX)
}

// Close deregisters the memory and ends the threads.
func (c *cuFileReader) Close() error {
	err := c.threads[0].Do(func() error { return c.lib.DeregisterBuffer(c.mem.Base) })
	c.stop()
	return err
}

func (c *cuFileReader) stop() {
	for _, t := range c.threads {
		t.Close()
	}
	c.threads = nil
}
