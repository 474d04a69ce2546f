// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/faults"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// unwritten is what the double's device memory holds before anything is
// published to it: a byte no test file is made of alone.
const unwritten = 0xA5

// gpuMemory is the loader tests' double of GPU batch memory: "device
// memory" is an anonymous host mapping the test reads back (filled with
// unwritten), and for a backend that writes host memory there is a
// staging area of the same shape that Publish copies over, as batchmem's
// GPU memory does.
type gpuMemory struct {
	desc      batchmem.Desc
	dev       []byte
	staging   []byte // nil when the backend writes device memory
	publishes atomic.Int64
}

// gpuDouble returns an Options.openMemory that makes GPU memory the
// double (kept in *out for the test) and any other kind as batchmem does.
func gpuDouble(t *testing.T, out **gpuMemory) func(batchmem.Kind, int, int64, batchmem.Options) (batchmem.Memory, error) {
	return func(kind batchmem.Kind, slots int, slotSize int64, o batchmem.Options) (batchmem.Memory, error) {
		if kind != batchmem.GPU {
			return batchmem.Open(kind, slots, slotSize, o)
		}
		slotSize = backend.AlignUp(slotSize)
		size := int(int64(slots) * slotSize)
		m := &gpuMemory{desc: batchmem.Desc{Kind: batchmem.GPU, Size: int64(size), SlotSize: slotSize, Slots: slots, Device: o.Device, NUMANode: -1}}
		var err error
		if m.dev, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			return nil, err
		}
		for i := range m.dev {
			m.dev[i] = unwritten
		}
		if !o.DeviceWrites {
			if m.staging, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
				unix.Munmap(m.dev)
				return nil, err
			}
		}
		*out = m
		return m, nil
	}
}

func (m *gpuMemory) Desc() batchmem.Desc { return m.desc }

func (m *gpuMemory) Slot(i int) batchmem.Region {
	off := int64(i) * m.desc.SlotSize
	r := batchmem.Region{Dev: addrOf(m.dev) + uintptr(off)}
	if m.staging != nil {
		r.Host = m.staging[off : off+m.desc.SlotSize : off+m.desc.SlotSize]
	}
	return r
}

func (m *gpuMemory) Publish(ctx context.Context, i int, n int64) error {
	m.publishes.Add(1)
	if m.staging == nil {
		return nil
	}
	off := int64(i) * m.desc.SlotSize
	copy(m.dev[off:off+n], m.staging[off:off+n])
	return ctx.Err()
}

func (m *gpuMemory) Export() (*os.File, error) {
	return nil, fmt.Errorf("the test double exports nothing")
}
func (m *gpuMemory) Pinned() error { return nil }
func (m *gpuMemory) Close() error {
	if m.staging != nil {
		unix.Munmap(m.staging)
	}
	return unix.Munmap(m.dev)
}

// addrOf is the address of b's first byte.
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// onDevice returns sample i of b as the device holds it.
func (m *gpuMemory) onDevice(b *Batch, i int) []byte {
	return m.dev[b.Offsets[i] : b.Offsets[i]+b.Lengths[i]]
}

// checkDevice compares every sample of b that did not fail, as the
// device holds it, with its file.
func checkDevice(t *testing.T, what string, m *bmap.Map, mem *gpuMemory, b *Batch) {
	t.Helper()
	failed := map[int]bool{}
	for _, i := range b.Failed {
		failed[i] = true
	}
	for i := 0; i < b.Len(); i++ {
		if failed[i] {
			continue
		}
		s := &m.Samples[b.Indices[i]]
		want, err := os.ReadFile(filepath.Join(m.Root, s.Path))
		if err != nil {
			t.Fatal(err)
		}
		if got := mem.onDevice(b, i); !bytes.Equal(got, want) {
			t.Fatalf("%s: epoch %d batch %d position %d: sample %s on the device (%d bytes at offset %d) differs from its file (%d bytes)%s",
				what, b.Epoch, b.Iteration, i, s.Path, len(got), b.Offsets[i], len(want), firstDiff(got, want))
		}
	}
}

// firstDiff says where got first differs from want.
func firstDiff(got, want []byte) string {
	for j := range min(len(got), len(want)) {
		if got[j] != want[j] {
			return fmt.Sprintf(": byte %d is %#x, want %#x", j, got[j], want[j])
		}
	}
	return ""
}

// TestGPUSkipErrorsPublished: with SkipErrors, a batch delivered with a
// failed sample (an injected EIO) is still copied to the device on the
// bounce path: its other samples, as the device holds them, equal their
// files, as do every other batch's.
func TestGPUSkipErrorsPublished(t *testing.T) {
	m := makeDataset(t, 40, 3, 6000)
	eio := m.Samples[9].Path
	inject(t, (&faults.Faults{}).Add(faults.Rule{Op: faults.FileRead, Path: eio, Err: unix.EIO}))
	var mem *gpuMemory
	o := Options{ReaderArgs: ReaderArgs{BatchSize: 8, RandomShuffle: true, Seed: 3}, Memory: batchmem.GPU, GPUPath: GPUPathBounce, Backend: "file", SkipErrors: true}
	o.openMemory = gpuDouble(t, &mem)
	l, err := New(context.Background(), m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for e := 0; e < 2; e++ {
		failed := 0
		errs := eachBatch(l, func(b *Batch) {
			failed += len(b.Failed)
			checkDevice(t, fmt.Sprintf("epoch %d", e), m, mem, b)
		})
		if len(errs) != 0 || failed != 1 {
			t.Fatalf("epoch %d: errors %v, %d failed samples delivered, want none and 1", e, errs, failed)
		}
	}
}
