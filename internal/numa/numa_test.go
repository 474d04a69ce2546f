// SPDX-License-Identifier: Apache-2.0

package numa

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParseList(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{"0-3,8,10-11", []int{0, 1, 2, 3, 8, 10, 11}, false},
		{"5", []int{5}, false},
		{"", nil, false},
		{"3-1", nil, true},
		{"a-b", nil, true},
	} {
		got, err := ParseList(tt.in)
		if (err != nil) != tt.bad || !slices.Equal(got, tt.want) {
			t.Errorf("ParseList(%q) = %v, %v", tt.in, got, err)
		}
	}
}

// TestOfPCIAndCPUs on a fake sysfs tree: a GPU on node 1 and its CPUs; a
// device without NUMA information is -1.
func TestOfPCIAndCPUs(t *testing.T) {
	sys := t.TempDir()
	write := func(p, s string) {
		os.MkdirAll(filepath.Dir(filepath.Join(sys, p)), 0o755)
		os.WriteFile(filepath.Join(sys, p), []byte(s), 0o644)
	}
	write("bus/pci/devices/0000:3b:00.0/numa_node", "1\n")
	write("bus/pci/devices/0000:af:00.0/numa_node", "-1\n")
	write("devices/system/node/node1/cpulist", "16-31,48-63\n")
	if n := OfPCI(sys, "0000:3B:00.0"); n != 1 {
		t.Errorf("node of 0000:3B:00.0: %d, want 1", n)
	}
	if n := OfPCI(sys, "0000:af:00.0"); n != -1 {
		t.Errorf("no NUMA information: %d, want -1", n)
	}
	if n := OfPCI(sys, "0000:00:00.0"); n != -1 {
		t.Errorf("missing device: %d, want -1", n)
	}
	cpus, err := CPUs(sys, 1)
	if err != nil || len(cpus) != 32 || cpus[0] != 16 || cpus[31] != 63 {
		t.Errorf("CPUs of node 1: %v, %v", cpus, err)
	}
	if _, err := CPUs(sys, 2); err == nil {
		t.Errorf("CPUs of a missing node: no error")
	}
}

// TestPreferAndPin on this machine's node 0: the mapping's policy shows in
// numa_maps, and a pinned thread runs only on the node's CPUs.
func TestPreferAndPin(t *testing.T) {
	cpus, err := CPUs(SysFS, 0)
	if err != nil {
		t.Skipf("no NUMA node 0 in sysfs here: %v", err)
	}
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := Prefer(mem, 0); err != nil {
		t.Fatal(err)
	}
	maps, _ := os.ReadFile("/proc/self/numa_maps")
	addr := strings.TrimLeft(strings.ToLower(uintptrHex(mem)), "0")
	found := false
	for _, line := range strings.Split(string(maps), "\n") {
		if strings.HasPrefix(line, addr+" ") {
			found = strings.Contains(line, "prefer:0")
		}
	}
	if !found {
		t.Errorf("numa_maps has no prefer:0 for the mapping at %s", addr)
	}
	if err := Prefer(mem, 64); err == nil {
		t.Errorf("node 64: no error")
	}
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := PinThread(cpus[:1]); err != nil {
			done <- err
			return
		}
		var set unix.CPUSet
		unix.SchedGetaffinity(0, &set)
		if set.Count() != 1 || !set.IsSet(cpus[0]) {
			t.Errorf("affinity after pinning to cpu %d: %d cpus", cpus[0], set.Count())
		}
		var all unix.CPUSet
		for _, c := range cpus {
			all.Set(c)
		}
		unix.SchedSetaffinity(0, &all)
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
func uintptrHex(b []byte) string {
	return fmt.Sprintf("%x", uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}
