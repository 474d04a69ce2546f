// SPDX-License-Identifier: Apache-2.0

// Package backend is the contract between the loader core and its backends.
// It holds the Backend interface, the Request, the errors, the alignment, Spec and Stats.
// A third-party backend implements Backend and is added with loader.Register.
// It imports nothing of the loader.
package backend

import (
	"context"
	"io"
	"log/slog"
	"unsafe"

	"github.com/nvfeed/nvfeed/bmap"
)

// Align is the alignment of batch slots and of every sample inside a
// slot: 4 KiB, what O_DIRECT and GPUDirect Storage (torch.cuda.gds) need.
const Align = 4096

// AlignUp rounds n up to a multiple of Align.
func AlignUp(n int64) int64 { return (n + Align - 1) &^ (Align - 1) }

// Request is one sample to read into batch memory.
type Request struct {
	Index  int          // sample index in the map
	Sample *bmap.Sample // the sample
	// Buf is the sample's room in host memory: its bytes land in Buf[At:At+Sample.Size].
	// The slack around them is the request's own; only the file's own bytes may go there.
	// The loader zeroes the slack and a failed sample's Buf after ReadBatch.
	//
	// A ragged room starts aligned and At is the data's phase in its file.
	// A dense row is exactly the sample's bytes and may be unaligned: use Addr.
	// Buf is nil when a backend writes device memory itself.
	Buf []byte
	At  int64 // where in Buf the sample's first byte goes
	// Dev is the sample's device address in GPU memory; 0 for host memory.
	// Only a DeviceWrites backend writes it; the others write Buf.
	Dev uintptr
	// DevRoom is how many bytes from Dev the backend may write; see DevBytes.
	// In a dense batch it is exactly Sample.Size.
	DevRoom int64
	// Whole is the map's sample when Sample is a part of it for a region of interest.
	// nil when Sample is the map's sample.
	Whole *bmap.Sample
	Err   error // set by the backend when this sample failed (a *SampleError)
}

// Mapped returns the map's sample the request reads (of): Whole, else
// Sample.
func (r *Request) Mapped() *bmap.Sample {
	if r.Whole != nil {
		return r.Whole
	}
	return r.Sample
}

// Addr returns the address of Buf[0], 0 for a nil Buf.
func (r *Request) Addr() uintptr {
	if cap(r.Buf) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(r.Buf)))
}

// Data returns the sample's bytes in Buf: Buf[At:At+Sample.Size].
func (r *Request) Data() []byte { return r.Buf[r.At : r.At+r.Sample.Size] }

// DevBytes returns how many bytes a device writer reads from Sample.Offset to Dev.
// It is the aligned length where the data starts a block and the room holds it.
// Else it is exactly Sample.Size. A DevRoom of 0 is taken as the aligned length.
func (r *Request) DevBytes() int64 {
	n := AlignUp(r.Sample.Size)
	if r.Sample.Offset%Align != 0 || r.Dev%Align != 0 || (r.DevRoom > 0 && r.DevRoom < n) {
		return r.Sample.Size
	}
	return n
}

// Backend reads samples into batch memory.
type Backend interface {
	// Name is the backend's registered name, e.g. "file".
	Name() string
	// ReadBatch reads every request and returns when all are done or ctx ended.
	// It sets Err on each failed request and returns the first error, or ctx's.
	// On return no read into any Buf is under way: the caller may reuse the memory.
	// It may be called from several goroutines at once.
	ReadBatch(ctx context.Context, reqs []Request) error
	// Stats returns the backend's counters so far.
	Stats() Stats
	// Close stops the backend's workers. No ReadBatch may be running.
	Close() error
}

// Env is everything a backend gets from its host besides its options.
// Every field but Logger may be unset; a backend then does without.
type Env struct {
	Logger *slog.Logger
	Trace  io.Writer // if set, a backend that reads the block device logs every device read as a fio iolog (v2) line
	// Cred, if set, is who every open is made as and whose check a changed raw sample needs.
	// nil: the process's own credentials.
	Cred *Cred
	// Guard is the map's freshness state shared with the host; nil: a raw backend opens its own.
	Guard Guard
	// Shared lets backends share resources by key with other loaders of
	// the host (the daemon: one raw engine per device); nil: their own.
	Shared Shared
	// Devices lets backends of the host share each block device's request
	// queue (the daemon: its tags split among the sessions' engines); nil:
	// each engine keeps its own depth in flight.
	Devices Shared
	// HostBuffers is the host batch memory, slot by slot, for registering once; nil if unknown.
	HostBuffers [][]byte
	// GPU is the batch memory on a GPU, for a backend that writes device
	// memory (its Spec's DeviceWrites); nil for host memory.
	GPU *GPUMemory
}

// GPUMemory is batch memory on a GPU: one allocation at Base of Size
// bytes, every Request.Dev inside it.
type GPUMemory struct {
	Device   int
	Base     uintptr
	Size     int64
	NUMANode int // the GPU's NUMA node, -1 unknown: workers go on its CPUs
	// Driver is the host's binding of the GPU driver that made this
	// memory. nil: none to share.
	Driver Driver
}

// Driver is the host's binding of the CUDA libraries, loaded once for the process.
// A backend that binds CUDA itself asks it which files to load.
type Driver interface {
	// Library returns the file the host loads CUDA library name from: "cudart" or "cufile".
	// An error says the host has no such library.
	Library(name string) (path string, err error)
}

// Opener opens a backend over a map with resolved options.
type Opener func(m *bmap.Map, p Params, env Env) (Backend, error)
