// SPDX-License-Identifier: Apache-2.0

package check

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// pciAddr matches a PCI device's sysfs name, e.g. 0000:3b:00.0.
var pciAddr = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// Place is where a device sits: its PCI path under sysfs's devices tree
// ("" for a virtual device such as a loop device) and its NUMA node (-1
// when unknown).
type Place struct {
	PCIPath  string `json:"pci_path"`  // e.g. /sys/devices/pci0000:00/0000:00:1d.0/0000:3b:00.0
	NUMANode int    `json:"numa_node"` // -1: unknown or a single-node machine
}

// blockPlace finds the PCI device above the block device major:minor.
func blockPlace(sysfs string, major, minor uint32) (Place, error) {
	p, err := filepath.EvalSymlinks(filepath.Join(sysfs, "dev", "block", fmt.Sprintf("%d:%d", major, minor)))
	if err != nil {
		return Place{NUMANode: -1}, fmt.Errorf("check: block device %d:%d in sysfs: %w", major, minor, err)
	}
	return pciPlace(p), nil
}

// gpuPlace finds a GPU's PCI device from NVML's bus id (e.g.
// 00000000:3B:00.0).
func gpuPlace(sysfs, busID string) (Place, error) {
	id := strings.ToLower(busID)
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) == 8 {
		id = dom[4:] + ":" + rest // NVML's 32-bit domain to sysfs's 16-bit one
	}
	p, err := filepath.EvalSymlinks(filepath.Join(sysfs, "bus", "pci", "devices", id))
	if err != nil {
		return Place{NUMANode: -1}, fmt.Errorf("check: GPU %s in sysfs: %w", busID, err)
	}
	return pciPlace(p), nil
}

// pciPlace returns the deepest PCI device on the path p (a resolved sysfs
// path) and its NUMA node.
func pciPlace(p string) Place {
	parts := strings.Split(p, "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if pciAddr.MatchString(parts[i]) {
			dev := strings.Join(parts[:i+1], "/")
			numa := -1
			if b, err := os.ReadFile(filepath.Join(dev, "numa_node")); err == nil {
				if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					numa = n
				}
			}
			return Place{PCIPath: dev, NUMANode: numa}
		}
	}
	return Place{NUMANode: -1}
}

// Relation says how data moving between a storage device and a GPU
// crosses the machine, closest first.
type Relation string

// Relations, in the spirit of nvidia-smi topo's PIX/PXB/PHB/NODE/SYS.
const (
	SameSwitch   Relation = "same PCIe switch"  // below one switch: peer-to-peer without the CPU
	SameBridge   Relation = "same host bridge"  // through one root complex
	SameNUMA     Relation = "same NUMA node"    // different host bridges of one socket
	CrossSockets Relation = "across sockets"    // over the inter-socket link: slower, warned
	Virtual      Relation = "virtual device"    // a loop or other device with no PCI path
	Unknown      Relation = "unknown placement" // sysfs did not tell
)

// relate places a storage device relative to a GPU from their PCI paths.
func relate(dev, gpu Place) Relation {
	if dev.PCIPath == "" {
		return Virtual
	}
	if gpu.PCIPath == "" {
		return Unknown
	}
	a := strings.Split(strings.TrimPrefix(dev.PCIPath, "/"), "/")
	b := strings.Split(strings.TrimPrefix(gpu.PCIPath, "/"), "/")
	common := 0
	for common < len(a) && common < len(b) && a[common] == b[common] {
		common++
	}
	// The host bridge is the component named pciDDDD:BB; below it the root
	// port, then switch ports.
	root := -1
	for i, c := range a {
		if strings.HasPrefix(c, "pci") {
			root = i
			break
		}
	}
	switch {
	case root >= 0 && common > root+1:
		return SameSwitch // they share a root port and more: behind one switch
	case root >= 0 && common == root+1:
		return SameBridge
	case dev.NUMANode >= 0 && gpu.NUMANode >= 0 && dev.NUMANode != gpu.NUMANode:
		return CrossSockets
	case dev.NUMANode >= 0 && dev.NUMANode == gpu.NUMANode:
		return SameNUMA
	}
	return Unknown
}
