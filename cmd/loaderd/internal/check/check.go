// SPDX-License-Identifier: Apache-2.0

// Package check is `loaderd check`: what this machine offers the loader.
// It reports Go and the kernel, io_uring and seccomp, and each dataset's device and map.
// It reports the CUDA libraries, the driver, the devices, and every GPU from NVML.
// It warns when data would cross sockets. Without a driver the check still succeeds.
package check

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/uring"
)

// Report is the result; its JSON form is `loaderd check --json`.
type Report struct {
	Go       string    `json:"go"`
	Kernel   string    `json:"kernel"`
	IOUring  Probe     `json:"io_uring"`
	Seccomp  string    `json:"seccomp"` // disabled, strict or filter (Docker's default profile is a filter)
	Datasets []Dataset `json:"datasets"`
	// Libraries are the CUDA libraries looked for: libcudart, libcufile.
	Libraries []Library `json:"cuda_libraries"`
	// SearchPath is where the CUDA libraries were looked for, in order
	// (cuda.Search.Places): the text names it once, not in every finding.
	SearchPath []string `json:"cuda_search_path"`
	// Driver says whether there is a driver, with the kernel module's version line if any.
	Driver      Probe         `json:"nvidia_driver"`
	CUDA        Probe         `json:"cuda_runtime"`
	CuFile      Probe         `json:"cufile"`
	CUDADevices []cuda.Device `json:"cuda_devices"` // as this process numbers them (CUDA_VISIBLE_DEVICES)
	NVML        Probe         `json:"nvml"`
	GPUs        []GPU         `json:"gpus"`
	Warnings    []string      `json:"warnings"`
}

// Library is one CUDA library: where it was found and how, and its
// version; or why it was not found.
type Library struct {
	Name    string `json:"name"`              // libcudart, libcufile
	Path    string `json:"path"`              // the file loaded, "" when none
	From    string `json:"from"`              // how it was found: NVFEED_CUDA_LIB_DIR, VIRTUAL_ENV (NVIDIA wheel), CUDA_HOME, the dynamic loader
	Version string `json:"version,omitempty"` // the library's own: CUDA runtime 13.0, cuFile 1.15
	Error   string `json:"error,omitempty"`   // why it was not found or its version not read
}

// Probe is one yes-or-no finding with what it found or why not.
type Probe struct {
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Dataset is what was found for one registered dataset.
type Dataset struct {
	Name     string            `json:"name"`
	Map      string            `json:"map"`
	Device   string            `json:"device"`
	FSType   string            `json:"fs_type"`
	Fresh    Probe             `json:"map_matches_filesystem"`
	ODirect  Probe             `json:"o_direct_read"`
	Place    Place             `json:"place"`
	ToGPU    map[string]string `json:"to_gpu,omitempty"` // GPU index -> relation
	RawShare float64           `json:"raw_share"`        // fraction of samples readable raw
}

// GPU is one NVIDIA GPU.
type GPU struct {
	Index       int    `json:"index"`
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	PCIBusID    string `json:"pci_bus_id"`
	MemoryBytes uint64 `json:"memory_bytes"`
	CPUAffinity string `json:"cpu_affinity"`
	Place       Place  `json:"place"`
}

// Options says what to check.
type Options struct {
	Datasets map[string]string // name -> map path
	Sysfs    string            // default /sys
	// Search is where the CUDA libraries are looked for; nil means the
	// process's environment (cuda.SearchFromEnv).
	Search *cuda.Search
}

// Run checks the machine. It fails only on a map that cannot be loaded;
// everything else is a finding.
func Run(o Options) (Report, error) {
	if o.Sysfs == "" {
		o.Sysfs = "/sys"
	}
	r := Report{Go: runtime.Version(), Kernel: kernel(), Seccomp: seccomp()}
	if ring, err := uring.New(8); err != nil {
		r.IOUring = Probe{Detail: err.Error()}
	} else {
		ring.Close()
		r.IOUring = Probe{OK: true, Detail: "allowed"}
	}
	search := cuda.SearchFromEnv()
	if o.Search != nil {
		search = *o.Search
	}
	for _, p := range search.Places() {
		r.SearchPath = append(r.SearchPath, p.Dir)
	}
	r.cudaLibraries(search)
	if r.Driver.OK {
		gpus, detail, err := nvmlGPUs()
		r.NVML = Probe{OK: err == nil, Detail: detail}
		if err != nil {
			r.NVML.Detail = err.Error()
		}
		for _, g := range gpus {
			g.Place, _ = gpuPlace(o.Sysfs, g.PCIBusID)
			r.GPUs = append(r.GPUs, g)
		}
	} else {
		r.NVML = Probe{Detail: "not tried: no driver"}
	}
	names := make([]string, 0, len(o.Datasets))
	for n := range o.Datasets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d, err := dataset(n, o.Datasets[n], o.Sysfs, r.GPUs)
		if err != nil {
			return r, err
		}
		for gi, rel := range d.ToGPU {
			if rel == string(CrossSockets) {
				r.Warnings = append(r.Warnings, fmt.Sprintf("dataset %s on %s and GPU %s are on different sockets: raw reads into that GPU cross the inter-socket link", n, d.Device, gi))
			}
		}
		r.Datasets = append(r.Datasets, d)
	}
	return r, nil
}

// cudaLibraries finds libcudart and libcufile, reads their versions and
// asks the runtime whether there is a driver and which devices it has.
func (r *Report) cudaLibraries(s cuda.Search) {
	module, moduleErr := cuda.DriverVersion()
	rtLib := Library{Name: cuda.Cudart().Name}
	rt, err := cuda.OpenRuntime(s)
	switch {
	case err != nil:
		rtLib.Error = err.Error()
		r.CUDA = Probe{Detail: err.Error()}
		r.Driver = Probe{Detail: "no runtime to ask"}
		if moduleErr == nil {
			r.Driver.Detail += "; the kernel module says " + module
		}
	default:
		rtLib.Path, rtLib.From = rt.Found.File(), rt.Found.From
		if v, err := rt.RuntimeVersion(); err != nil {
			rtLib.Error = err.Error()
		} else {
			rtLib.Version = "CUDA runtime " + cuda.FormatVersion(v)
		}
		r.CUDA = Probe{OK: rtLib.Error == "", Detail: fmt.Sprintf("%s: %s", rt.Found, rtLib.Version)}
		if d, err := rt.DriverVersion(); err != nil {
			r.Driver = Probe{Detail: "no driver: " + strings.TrimPrefix(err.Error(), "cuda: "+cuda.ErrNoDriver.Error()+": ")}
		} else {
			r.Driver = Probe{OK: true, Detail: "CUDA " + cuda.FormatVersion(d) + " (cudaDriverGetVersion)"}
			if moduleErr == nil {
				r.Driver.Detail += "; " + module
			}
			if devs, err := rt.Devices(); err != nil {
				r.Warnings = append(r.Warnings, fmt.Sprintf("CUDA devices not listed: %v", err))
			} else {
				r.CUDADevices = devs
			}
		}
	}
	cfLib := Library{Name: cuda.Cufile().Name}
	c := cuda.ProbeCuFile(s)
	switch {
	case c.Found.Path == "":
		cfLib.Error = c.Err.Error()
		r.CuFile = Probe{Detail: c.Err.Error()}
	default:
		cfLib.Path, cfLib.From = c.Found.File(), c.Found.From
		if c.Err != nil {
			cfLib.Error = c.Err.Error()
		} else {
			cfLib.Version = "cuFile " + cuda.FormatCuFileVersion(c.Version)
		}
		r.CuFile = Probe{OK: true, Detail: c.Found.String() + " loads (GDS or compatibility mode is measured when a GPU session opens cuFile)"}
	}
	r.Libraries = []Library{rtLib, cfLib}
}

func dataset(name, path, sysfs string, gpus []GPU) (Dataset, error) {
	m, err := bmap.Load(path)
	if err != nil {
		return Dataset{}, fmt.Errorf("check: dataset %s: %w", name, err)
	}
	d := Dataset{Name: name, Map: path, Device: m.Device.Path, FSType: m.Device.FSType}
	if st := m.Stats(); st.Samples > 0 {
		d.RawShare = float64(st.Samples-st.FSOnly) / float64(st.Samples)
	}
	if ck, err := m.NewChecker(); err != nil {
		d.Fresh = Probe{Detail: err.Error()}
	} else {
		ck.Close()
		d.Fresh = Probe{OK: true, Detail: "the mounted filesystem is the one mapped"}
	}
	d.ODirect = readDirect(m.Device.Path)
	d.Place, _ = blockPlace(sysfs, m.Device.Major, m.Device.Minor)
	for _, g := range gpus {
		if d.ToGPU == nil {
			d.ToGPU = map[string]string{}
		}
		d.ToGPU[fmt.Sprint(g.Index)] = string(relate(d.Place, g.Place))
	}
	return d, nil
}

// readDirect opens dev read-only with O_DIRECT and reads its first 4 KiB.
func readDirect(dev string) Probe {
	if dev == "" {
		return Probe{Detail: "the map names no device"}
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		why := err.Error()
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			why += " (raw backends need read access to the device: run loaderd as a user who has it)"
		}
		return Probe{Detail: fmt.Sprintf("open %s: %s", dev, why)}
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return Probe{Detail: err.Error()}
	}
	defer unix.Munmap(buf)
	if n, err := unix.Pread(fd, buf, 0); err != nil || n != len(buf) {
		return Probe{Detail: fmt.Sprintf("read 4 KiB of %s with O_DIRECT: %d bytes, %v", dev, n, err)}
	}
	return Probe{OK: true, Detail: "opens and reads 4 KiB with O_DIRECT"}
}

func kernel() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err.Error()
	}
	return unix.ByteSliceToString(u.Release[:])
}

// seccomp reads this process's seccomp mode from /proc/self/status.
func seccomp() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown: " + err.Error()
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Seccomp:"); ok {
			switch strings.TrimSpace(v) {
			case "0":
				return "disabled"
			case "1":
				return "strict"
			case "2":
				return "filter"
			}
		}
	}
	return "unknown"
}

// WriteJSON writes the report as one JSON object.
func (r Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// WriteText writes the report for a person.
func (r Report) WriteText(w io.Writer) {
	yes := func(p Probe) string {
		if p.OK {
			return "yes: " + p.Detail
		}
		return "no: " + p.Detail
	}
	fmt.Fprintf(w, "go            %s\nkernel        %s\nio_uring      %s\nseccomp       %s\n", r.Go, r.Kernel, yes(r.IOUring), r.Seccomp)
	for _, d := range r.Datasets {
		fmt.Fprintf(w, "dataset %s (%s): %s on %s, %.0f%% of samples raw\n", d.Name, d.Map, d.FSType, d.Device, 100*d.RawShare)
		fmt.Fprintf(w, "  map fresh   %s\n  O_DIRECT    %s\n", yes(d.Fresh), yes(d.ODirect))
		if d.Place.PCIPath == "" {
			fmt.Fprintf(w, "  placement   virtual device (no PCI path)\n")
		} else {
			fmt.Fprintf(w, "  placement   %s, NUMA node %d\n", d.Place.PCIPath, d.Place.NUMANode)
		}
		for gi, rel := range d.ToGPU {
			fmt.Fprintf(w, "  to GPU %s    %s\n", gi, rel)
		}
	}
	once := r.sayOnce()
	if len(r.SearchPath) > 0 {
		fmt.Fprintf(w, "cuda search   %s\n", strings.Join(r.SearchPath, ", "))
	}
	for _, l := range r.Libraries {
		switch {
		case l.Path == "":
			fmt.Fprintf(w, "%-13s not found: %s\n", l.Name, once(l.Error))
		case l.Error != "":
			fmt.Fprintf(w, "%-13s %s (found by %s), version unknown: %s\n", l.Name, l.Path, l.From, l.Error)
		default:
			fmt.Fprintf(w, "%-13s %s (found by %s), %s\n", l.Name, l.Path, l.From, l.Version)
		}
	}
	// A probe that failed for want of a library says so by the library's
	// name: the reason is on the library's line above.
	probe := func(p Probe, lib string) string {
		for _, l := range r.Libraries {
			if !p.OK && l.Name == lib && l.Error != "" && strings.HasSuffix(p.Detail, l.Error) {
				return "no: " + lib + " not found (above)"
			}
		}
		return yes(p)
	}
	fmt.Fprintf(w, "driver        %s\ncuda          %s\ncufile        %s\nnvml          %s\n", yes(r.Driver),
		probe(r.CUDA, cuda.Cudart().Name), probe(r.CuFile, cuda.Cufile().Name), yes(r.NVML))
	for _, d := range r.CUDADevices {
		fmt.Fprintf(w, "cuda device %d %s, PCI %s\n", d.Ordinal, d.UUID, d.PCIBusID)
	}
	for _, g := range r.GPUs {
		fmt.Fprintf(w, "gpu %d         %s %s, %s, %.1f GiB, NUMA node %d, CPUs %s\n", g.Index, g.Name, g.UUID, g.PCIBusID,
			float64(g.MemoryBytes)/(1<<30), g.Place.NUMANode, g.CPUAffinity)
	}
	if !r.Driver.OK {
		fmt.Fprintln(w, "no driver: no NVIDIA driver here, so GPU memory and cuFile are unavailable; host-memory backends work.")
	}
	for _, m := range r.Warnings {
		fmt.Fprintf(w, "warning: %s\n", m)
	}
}

// sayOnce returns a function that replaces the search path in a library's error by a reference.
func (r Report) sayOnce() func(string) string {
	if len(r.SearchPath) == 0 {
		return func(s string) string { return s }
	}
	dirs := " in " + strings.Join(r.SearchPath, ", ")
	return func(s string) string { return strings.ReplaceAll(s, dirs, " in the cuda search path") }
}
