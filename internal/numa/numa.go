// SPDX-License-Identifier: Apache-2.0

// Package numa places memory and threads on a NUMA node. It reads the node
// of a PCI device, such as a GPU, and the node's CPUs from sysfs. It sets a
// memory range's preferred node (mbind) and a thread's CPUs
// (sched_setaffinity).
package numa

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SysFS is where sysfs is mounted.
const SysFS = "/sys"

// OfPCI returns the NUMA node of the PCI device busID under sysfs. busID is
// written as "0000:3b:00.0", in any case. It returns -1 when the machine
// has no NUMA information for the device: on a single-node machine, or when
// the device is not there.
func OfPCI(sysfs, busID string) int {
	b, err := os.ReadFile(filepath.Join(sysfs, "bus", "pci", "devices", strings.ToLower(busID), "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// CPUs returns the CPUs of node under sysfs.
func CPUs(sysfs string, node int) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(sysfs, "devices", "system", "node", fmt.Sprintf("node%d", node), "cpulist"))
	if err != nil {
		return nil, fmt.Errorf("numa: node %d: %w", node, err)
	}
	return ParseList(strings.TrimSpace(string(b)))
}

// ParseList parses a kernel CPU list such as "0-3,8,10-11".
func ParseList(s string) ([]int, error) {
	var out []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("numa: cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("numa: cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}

// mpolPreferred is MPOL_PREFERRED: allocate on the node when it has room.
const mpolPreferred = 1

// Prefer makes node the preferred node of mem's pages not yet allocated
// (mbind, MPOL_PREFERRED): call it before first use.
func Prefer(mem []byte, node int) error {
	if len(mem) == 0 || node < 0 || node >= 64 {
		return fmt.Errorf("numa: prefer node %d for %d bytes: out of range", node, len(mem))
	}
	mask := uint64(1) << node
	_, _, errno := unix.Syscall6(unix.SYS_MBIND, uintptr(unsafe.Pointer(unsafe.SliceData(mem))), uintptr(len(mem)),
		mpolPreferred, uintptr(unsafe.Pointer(&mask)), 64, 0)
	if errno != 0 {
		return fmt.Errorf("numa: mbind %d bytes to node %d: %w", len(mem), node, errno)
	}
	return nil
}

// PinThread restricts the calling OS thread to cpus (lock the goroutine to
// its thread first).
func PinThread(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("numa: pin thread to cpus %v: %w", cpus, err)
	}
	return nil
}
