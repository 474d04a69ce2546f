// SPDX-License-Identifier: Apache-2.0

// Package backend is the contract between the loader core and the
// backends that read samples into batch memory: the Backend interface, a
// Request per sample, the errors every backend reports, the 4 KiB
// alignment of batch memory, each backend's self-description (Spec) and
// its labeled counters (Stats). A third-party backend implements Backend,
// describes itself with a Spec and is added with loader.Register.
//
// It imports nothing of the loader, so the core and every backend package
// can share it.
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
	// Buf is the sample's room in host memory: its bytes, the file's
	// bytes [Sample.Offset, Sample.Offset+Sample.Size), land in
	// Buf[At:At+Sample.Size]. Buf[:At] and Buf[At+Sample.Size:] are the
	// request's own slack: no other request's bytes lie there, a backend
	// may write it, but only with the sample's file's own bytes (clients
	// map batch memory while it is written), and the loader zeroes it,
	// and a failed sample's whole Buf, after ReadBatch.
	//
	// A ragged room starts Align-aligned, At is the data's phase in its
	// file (Sample.Offset % Align: 0 for a whole file) and the room is
	// AlignUp(At+Sample.Size) bytes, so that the file's blocks land in
	// place with O_DIRECT. A dense row is exactly the sample's bytes
	// (At 0, len Sample.Size) and its address need not be aligned: the
	// bytes before and after it are other rows; a backend judges by the
	// address (Addr) where an aligned read can land in place.
	//
	// Buf is nil when the destination is device memory a backend writes
	// itself (Dev).
	Buf []byte
	At  int64 // where in Buf the sample's first byte goes
	// Dev is the device address of the sample's first byte when batch
	// memory is on a GPU; 0 for host memory. Only a backend whose Spec
	// says DeviceWrites writes it; the others write Buf, a host staging
	// area the memory copies over.
	Dev uintptr
	// DevRoom is how many bytes from Dev the backend may write (DevBytes):
	// the rest of the sample's room, at least Sample.Size, where each
	// sample has a room of its own; exactly Sample.Size in a dense batch,
	// whose samples lie back to back on the device (the next sample's
	// bytes start right after).
	DevRoom int64
	// Whole is the map's sample when Sample is a part of it: a copy with
	// Offset and Size narrowed to the bytes of the file a region of
	// interest needs (one request per part, all with Whole's Index); nil
	// when Sample is the map's sample. A backend reads Sample's bytes as
	// always, and compares the file (its size, a tensor's header) with
	// Mapped.
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

// Addr returns the address of Buf[0], 0 for a nil Buf: with the file
// offset Sample.Offset-At it says whether an aligned (O_DIRECT) read may
// land in Buf.
func (r *Request) Addr() uintptr {
	if cap(r.Buf) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(r.Buf)))
}

// Data returns the sample's bytes in Buf: Buf[At:At+Sample.Size].
func (r *Request) Data() []byte { return r.Buf[r.At : r.At+r.Sample.Size] }

// DevBytes returns how many bytes a backend writing device memory reads
// from the file's byte Sample.Offset to Dev: the sample's aligned length
// where its data starts a block of its file and of the device and the
// room holds it (whole blocks, as direct reads want; a file that grew
// shows up as a longer read), else exactly Sample.Size (a tensor's data
// after its header, or a dense row: then the backend compares the file's
// size itself). A DevRoom of 0 is taken as the aligned length.
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
	// ReadBatch reads every request and returns when all are done or
	// abandoned because ctx ended. It sets Err on each request that failed
	// and returns the first such error (nil when all succeeded; ctx's error
	// when it ended with no sample failing). When ReadBatch returns, no
	// read into any request's Buf is still under way and none will start:
	// the caller may reuse the memory at once. ReadBatch may be called from
	// several goroutines at once (one per batch in flight).
	ReadBatch(ctx context.Context, reqs []Request) error
	// Stats returns the backend's counters so far.
	Stats() Stats
	// Close stops the backend's workers. No ReadBatch may be running.
	Close() error
}

// Env is everything a backend gets from its host besides its options,
// the same for the built-in backends and any registered one: the
// logger, whom it reads for, the map's freshness guard, resources shared
// with other backends, the host slots it may register, where GPU batch
// memory is, and for benchmarks a trace of device reads. Every field but
// Logger may be unset; a backend does without (its own guard, its own
// resources, the process's credentials).
type Env struct {
	Logger *slog.Logger
	Trace  io.Writer // if set, a backend that reads the block device logs every device read as a fio iolog (v2) line
	// Cred, if set, is who every filesystem open is made as (NewCaller:
	// the kernel checks it), and whose check a raw read of a changed
	// sample must pass; nil: the process's own credentials. The daemon
	// always sets it to its client's.
	Cred *Cred
	// Guard is the map's freshness state, shared with the host (the
	// daemon keeps one per dataset); nil: a backend reading raw extents
	// opens its own (package bmap/fresh).
	Guard Guard
	// Shared lets backends share resources by key with other loaders of
	// the host (the daemon: one raw engine per device); nil: their own.
	Shared Shared
	// HostBuffers is the host batch memory every Request.Buf lies in,
	// slot by slot, for a backend that registers it once (io_uring fixed
	// buffers); nil when not known.
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

// Driver is the host's binding of the GPU driver: the CUDA libraries it
// loads once for the process. A backend that binds CUDA itself asks it
// which files to load, so the process holds one copy of each.
type Driver interface {
	// Library returns the file the host loads CUDA library name from,
	// loading it at the first ask. The names are "cudart" and "cufile".
	// An error says the host has no such library.
	Library(name string) (path string, err error)
}

// Opener opens a backend over a map with resolved options.
type Opener func(m *bmap.Map, p Params, env Env) (Backend, error)
