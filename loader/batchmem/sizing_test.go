// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/cuda/standin"
)

// held returns what m holds: its host bytes (host memory's memfd, GPU
// memory's staging memfd) as the kernel sizes them, and its device bytes
// (the allocation's).
func held(t *testing.T, m Memory) Sizes {
	t.Helper()
	memfd := func(h *host) int64 {
		var st unix.Stat_t
		if err := unix.Fstat(h.fd, &st); err != nil {
			t.Fatal(err)
		}
		return st.Size
	}
	switch m := m.(type) {
	case *host:
		return Sizes{SlotSize: m.desc.SlotSize, Host: memfd(m)}
	case *gpu:
		s := Sizes{SlotSize: m.desc.SlotSize, Device: m.alloc.Size()}
		if m.staging != nil {
			s.Host = memfd(m.staging)
		}
		return s
	}
	t.Fatalf("memory %T", m)
	return Sizes{}
}

// TestSizingIsAllocation: what Sizing says Open allocates is what Open
// holds, host memory (its memfd) and GPU memory on the fake device (its
// allocation and the staging area's memfd; a device writer has none),
// for sizes on and off the granularity.
func TestSizingIsAllocation(t *testing.T) {
	for _, tc := range []struct {
		kind         Kind
		slots        int
		slotSize     int64
		deviceWrites bool
	}{
		{Pinned, 3, 5000, false},
		{Pinned, 4, Granularity / 4, false},
		{Pinned, 5, Granularity/2 + 4096, false},
		{GPU, 3, 8192, false},
		{GPU, 3, 8192, true},
		{GPU, 7, 3 << 20, false},
	} {
		want, err := Sizing(tc.kind, tc.slots, tc.slotSize, tc.deviceWrites)
		if err != nil {
			t.Fatal(err)
		}
		var m Memory
		if tc.kind == GPU {
			m, err = openFake(newFake(t), tc.slots, tc.slotSize, Options{DeviceWrites: tc.deviceWrites})
		} else {
			m, err = Open(tc.kind, tc.slots, tc.slotSize, Options{})
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := held(t, m); got != want {
			t.Errorf("%d %s slots of %d (device writes %v): Open holds %+v, Sizing says %+v", tc.slots, tc.kind, tc.slotSize, tc.deviceWrites, got, want)
		}
		m.Close()
	}
}

// TestSizingRefusesCoarserDevice: a device whose allocation granularity
// is over Granularity would hold more than Sizing says: refused.
func TestSizingRefusesCoarserDevice(t *testing.T) {
	dev := newFake(t)
	dev.granule = 2 * Granularity
	if m, err := openFake(dev, 1, 4096, Options{}); err == nil {
		m.Close()
		t.Fatal("a 4 MiB granularity accepted")
	}
}

// TestStandinSizingIsAllocation: on the CUDA stand-in (2 MiB
// granularity), GPU memory holds what Sizing says, device and staging.
func TestStandinSizingIsAllocation(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	for _, dw := range []bool{false, true} {
		want, err := Sizing(GPU, 3, 700<<10, dw)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Open(GPU, 3, 700<<10, Options{DeviceWrites: dw})
		if err != nil {
			t.Fatal(err)
		}
		if got := held(t, m); got != want {
			t.Errorf("device writes %v: Open holds %+v, Sizing says %+v", dw, got, want)
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKind checks the decisions a memory kind answers for its callers.
func TestKind(t *testing.T) {
	for _, c := range []struct {
		k                  Kind
		def                Kind
		ok, onGPU, packsFs bool
	}{
		{"", Pinned, true, false, false},
		{Pinned, Pinned, true, false, false},
		{GPU, GPU, true, true, true},
		{"cxl", "cxl", false, false, false},
	} {
		if got := c.k.OrDefault(); got != c.def {
			t.Errorf("%q.OrDefault() = %q, want %q", c.k, got, c.def)
		}
		if err := c.k.Check(); (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrKind)) {
			t.Errorf("%q.Check() = %v, want ok %v", c.k, err, c.ok)
		}
		if c.k.OnGPU() != c.onGPU || c.k.PacksFiles() != c.packsFs {
			t.Errorf("%q: OnGPU %v PacksFiles %v, want %v %v", c.k, c.k.OnGPU(), c.k.PacksFiles(), c.onGPU, c.packsFs)
		}
	}
}
