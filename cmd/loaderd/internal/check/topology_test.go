// SPDX-License-Identifier: Apache-2.0

package check

import (
	"os"
	"path/filepath"
	"testing"
)

// fakeSysfs lays out two sockets as sysfs shows them: host bridge
// pci0000:00 (NUMA 0) with a root port, a switch and behind it an NVMe
// drive and GPU 0; GPU 1 on another root port of the same bridge; GPU 2
// on host bridge pci0000:80 (NUMA 1); and a loop device.
func fakeSysfs(t *testing.T) string {
	root := t.TempDir()
	dev := func(p string, numa string) string {
		full := filepath.Join(root, "devices", p)
		if err := os.MkdirAll(full, 0o755); err != nil {
			t.Fatal(err)
		}
		if numa != "" {
			os.WriteFile(filepath.Join(full, "numa_node"), []byte(numa+"\n"), 0o644)
		}
		return full
	}
	link := func(target, name string) {
		os.MkdirAll(filepath.Dir(name), 0o755)
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	sw := "pci0000:00/0000:00:03.0/0000:01:00.0/0000:02:08.0"
	dev(sw+"/0000:03:00.0/nvme/nvme0/nvme0n1/nvme0n1p2", "")
	dev(sw+"/0000:03:00.0", "0")
	dev(sw+"/0000:04:00.0", "0")
	dev("pci0000:00/0000:00:05.0/0000:05:00.0", "0")
	dev("pci0000:80/0000:80:01.0/0000:81:00.0", "1")
	dev("virtual/block/loop0", "")
	link(filepath.Join(root, "devices", sw, "0000:03:00.0/nvme/nvme0/nvme0n1/nvme0n1p2"), filepath.Join(root, "dev/block/259:2"))
	link(filepath.Join(root, "devices/virtual/block/loop0"), filepath.Join(root, "dev/block/7:0"))
	link(filepath.Join(root, "devices", sw, "0000:04:00.0"), filepath.Join(root, "bus/pci/devices/0000:04:00.0"))
	link(filepath.Join(root, "devices/pci0000:00/0000:00:05.0/0000:05:00.0"), filepath.Join(root, "bus/pci/devices/0000:05:00.0"))
	link(filepath.Join(root, "devices/pci0000:80/0000:80:01.0/0000:81:00.0"), filepath.Join(root, "bus/pci/devices/0000:81:00.0"))
	return root
}

func TestTopology(t *testing.T) {
	sys := fakeSysfs(t)
	nvme, err := blockPlace(sys, 259, 2)
	if err != nil || filepath.Base(nvme.PCIPath) != "0000:03:00.0" || nvme.NUMANode != 0 {
		t.Fatalf("nvme partition: %+v %v, want PCI device 0000:03:00.0 on NUMA 0", nvme, err)
	}
	loop, err := blockPlace(sys, 7, 0)
	if err != nil || loop.PCIPath != "" {
		t.Fatalf("loop device: %+v %v, want no PCI path", loop, err)
	}
	if _, err := blockPlace(sys, 8, 0); err == nil {
		t.Error("a device sysfs does not list was placed")
	}
	tests := []struct {
		busID string // as NVML reports it
		want  Relation
	}{
		{"00000000:04:00.0", SameSwitch},
		{"00000000:05:00.0", SameBridge},
		{"00000000:81:00.0", CrossSockets},
	}
	for _, tt := range tests {
		g, err := gpuPlace(sys, tt.busID)
		if err != nil {
			t.Fatalf("%s: %v", tt.busID, err)
		}
		if got := relate(nvme, g); got != tt.want {
			t.Errorf("nvme to GPU %s: %q, want %q", tt.busID, got, tt.want)
		}
		if got := relate(loop, g); got != Virtual {
			t.Errorf("loop to GPU %s: %q, want %q", tt.busID, got, Virtual)
		}
	}
	// Different host bridges on one socket.
	other := Place{PCIPath: filepath.Join(sys, "devices/pci0000:40/0000:40:01.0/0000:41:00.0"), NUMANode: 0}
	if got := relate(nvme, other); got != SameNUMA {
		t.Errorf("same socket, other bridge: %q", got)
	}
}
