// SPDX-License-Identifier: Apache-2.0

package cufile

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/numa"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// errClosed is returned by a read after Close.
var errClosed = errors.New("cufile: reader closed")

// cuFileReader is reader on a real GPU: one locked thread per worker with
// the GPU current, the batch memory registered once where cuFile takes it.
type cuFileReader struct {
	lib        *cuda.CuFileLib
	mem        backend.GPUMemory
	uuid       string // the GPU's: cuFile's statistics are matched by it
	props      cuda.DriverProps
	propsErr   error
	registered bool // cuFileBufRegister took the memory: Close deregisters it

	// mu guards threads and closed: reads and Stats (a metrics scrape,
	// at any time) hold it shared, Close exclusively, so that nothing uses
	// a thread Close has ended.
	mu      sync.RWMutex
	threads []*cuda.Thread
	closed  bool
	final   modeStats // the statistics at Close, what Stats says after
}

// openCuFile gets libcufile with its driver open from libs (opened once
// per process, bounded in time, left open for the process's life, as
// KvikIO does: the driver is process-wide and shared by every session)
// and registers mem. A registration cuFile refuses is a warning: it reads
// into unregistered memory through its own bounce buffers (cufile.h), as
// KvikIO does.
func openCuFile(mem backend.GPUMemory, workers int, log *slog.Logger, libs *cuda.Libs) (*cuFileReader, error) {
	rt, err := libs.Load()
	if err != nil {
		return nil, err
	}
	devs, err := rt.Devices()
	if err != nil {
		return nil, err
	}
	if mem.Device < 0 || mem.Device >= len(devs) {
		return nil, fmt.Errorf("cufile: GPU %d: this process sees %d GPUs", mem.Device, len(devs))
	}
	lib, err := libs.CuFileDriver()
	if err != nil {
		return nil, err
	}
	c := &cuFileReader{lib: lib, mem: mem, uuid: devs[mem.Device].UUID}
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
	var regErr error
	err = c.threads[0].Do(func() error {
		c.props, c.propsErr = lib.Properties()
		regErr = lib.RegisterBuffer(mem.Base, mem.Size)
		return nil
	})
	if err != nil {
		c.stop()
		return nil, err
	}
	if regErr != nil {
		log.Warn("cufile: batch memory not registered with cuFile: reads go through cuFile's bounce buffers", "gpu", c.uuid, "bytes", mem.Size, "err", regErr)
	} else {
		c.registered = true
	}
	log.Info("cufile: cuFile open", "libcufile", lib.Found.File(), "found_by", lib.Found.From, "gpu", c.uuid, "registered", c.registered)
	return c, nil
}

// Read registers fd, reads size bytes from its offset off into dst (at
// its offset in the batch memory) and deregisters, on worker's thread.
func (c *cuFileReader) Read(worker, fd int, dst uintptr, size, off int64) (int64, error) {
	if dst < c.mem.Base || int64(dst-c.mem.Base)+size > c.mem.Size {
		return 0, fmt.Errorf("cufile: destination %#x+%d outside the batch memory [%#x, +%d)", dst, size, c.mem.Base, c.mem.Size)
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return 0, errClosed
	}
	var n int64
	err := c.threads[worker].Do(func() error {
		h, err := c.lib.RegisterFile(fd)
		if err != nil {
			return err
		}
		defer c.lib.DeregisterFile(h)
		n, err = c.lib.Read(h, c.mem.Base, size, off, int64(dst-c.mem.Base))
		return err
	})
	return n, err
}

// Stats reads cuFile's statistics for the GPU (matched by UUID) and says
// what mode they show; after Close, what they showed then.
func (c *cuFileReader) Stats() modeStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return c.final
	}
	return c.stats()
}

// stats reads the statistics on the first thread; c.mu is held.
func (c *cuFileReader) stats() modeStats {
	var reads []cuda.GPUReads
	err := c.threads[0].Do(func() error {
		var err error
		reads, err = c.lib.Reads()
		return err
	})
	return decideMode(c.uuid, reads, err, c.props, c.propsErr)
}

// Close deregisters the memory (if cuFile took it) and ends the threads;
// Stats goes on answering with the last statistics.
func (c *cuFileReader) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.final = c.stats()
	var err error
	if c.registered {
		err = c.threads[0].Do(func() error { return c.lib.DeregisterBuffer(c.mem.Base) })
		c.registered = false
	}
	c.stop()
	c.closed = true
	return err
}

func (c *cuFileReader) stop() {
	for _, t := range c.threads {
		t.Close()
	}
	c.threads = nil
}

// modeStats is what cuFile says ran for the GPU: the mode (gds, compat,
// mixed, none before any read, unknown), why, and the read counts.
type modeStats struct {
	Mode, Why  string
	P2P, POSIX int64
}

// decideMode reads the GPU's mode from cuFile's level-3 statistics,
// matched by the GPU's UUID (cuFile's order is not CUDA's). Where they
// list no reads for it (compatibility mode builds no GPU topology and lists
// no GPU), the driver's properties decide: no nvidia-fs is compatibility
// mode. "unknown" comes with the reason.
func decideMode(uuid string, reads []cuda.GPUReads, readsErr error, props cuda.DriverProps, propsErr error) modeStats {
	if readsErr != nil {
		return modeStats{Mode: "unknown", Why: fmt.Sprintf("cuFile's statistics unreadable: %v", readsErr)}
	}
	var listed []string
	for _, r := range reads {
		listed = append(listed, r.UUID)
		if !cuda.SameUUID(r.UUID, uuid) {
			continue
		}
		st := modeStats{Mode: r.Mode(), P2P: int64(r.P2P + r.NVFS), POSIX: int64(r.POSIX)}
		if st.Mode != "none" {
			st.Why = fmt.Sprintf("cuFile's statistics for %s: %d reads peer to peer or through nvidia-fs, %d POSIX reads", uuid, st.P2P, st.POSIX)
			return st
		}
	}
	nvfs := fmt.Sprintf("cuFileDriverGetProperties: nvidia-fs %d.%d", props.NVFSMajor, props.NVFSMinor)
	if propsErr != nil {
		nvfs = fmt.Sprintf("its driver's properties unreadable: %v", propsErr)
	}
	switch {
	case propsErr != nil && len(reads) == 0:
		return modeStats{Mode: "unknown", Why: fmt.Sprintf("cuFile lists no GPU in its statistics and its driver's properties are unreadable: %v", propsErr)}
	case propsErr == nil && !props.NVFS():
		why := "nvidia-fs is not loaded (" + nvfs + ")"
		if len(reads) == 0 {
			why += "; cuFile lists no GPU in its statistics"
		}
		return modeStats{Mode: "compat", Why: why}
	case len(reads) == 0:
		return modeStats{Mode: "compat", Why: "cuFile lists no GPU in its statistics: its compatibility mode builds no GPU topology (" + nvfs + ")"}
	case !contains(listed, uuid):
		return modeStats{Mode: "unknown", Why: fmt.Sprintf("cuFile's statistics list %s, not this session's GPU %s", strings.Join(listed, ", "), uuid)}
	}
	return modeStats{Mode: "none", Why: "no reads yet (" + nvfs + ")"}
}

func contains(uuids []string, uuid string) bool {
	for _, u := range uuids {
		if cuda.SameUUID(u, uuid) {
			return true
		}
	}
	return false
}
