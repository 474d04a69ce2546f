// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package check

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlGPUs lists the GPUs through NVML. Every call after Init is guarded:
// once Init has failed (the library missing), calling any other NVML
// function ends the process with a symbol lookup error.
func nvmlGPUs() ([]GPU, string, error) {
	if r := nvml.Init(); r != nvml.SUCCESS {
		if r == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, "", fmt.Errorf("NVML library (libnvidia-ml) not found")
		}
		return nil, "", fmt.Errorf("NVML init failed (code %d)", int(r))
	}
	defer nvml.Shutdown()
	ver, r := nvml.SystemGetDriverVersion()
	if r != nvml.SUCCESS {
		ver = "unknown"
	}
	n, r := nvml.DeviceGetCount()
	if r != nvml.SUCCESS {
		return nil, "", fmt.Errorf("NVML device count: %s", nvml.ErrorString(r))
	}
	var gpus []GPU
	for i := 0; i < n; i++ {
		dev, r := nvml.DeviceGetHandleByIndex(i)
		if r != nvml.SUCCESS {
			return gpus, "", fmt.Errorf("NVML device %d: %s", i, nvml.ErrorString(r))
		}
		g := GPU{Index: i}
		g.Name, _ = dev.GetName()
		g.UUID, _ = dev.GetUUID()
		if pci, r := dev.GetPciInfo(); r == nvml.SUCCESS {
			var b strings.Builder
			for _, c := range pci.BusId {
				if c == 0 {
					break
				}
				b.WriteByte(byte(c))
			}
			g.PCIBusID = b.String()
		}
		if mem, r := dev.GetMemoryInfo(); r == nvml.SUCCESS {
			g.MemoryBytes = mem.Total
		}
		if mask, r := dev.GetCpuAffinity(16); r == nvml.SUCCESS {
			g.CPUAffinity = cpuList(mask)
		}
		gpus = append(gpus, g)
	}
	return gpus, fmt.Sprintf("driver %s, %d GPU(s)", ver, n), nil
}

// cpuList renders an affinity bit mask as "0-15,32-47".
func cpuList(mask []uint) string {
	var parts []string
	start := -1
	bit := func(i int) bool { return mask[i/64]>>(i%64)&1 == 1 }
	total := len(mask) * 64
	for i := 0; i <= total; i++ {
		if i < total && bit(i) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 {
			if start == i-1 {
				parts = append(parts, fmt.Sprint(start))
			} else {
				parts = append(parts, fmt.Sprintf("%d-%d", start, i-1))
			}
			start = -1
		}
	}
	return strings.Join(parts, ",")
}
