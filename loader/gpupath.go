// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"fmt"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader/backend"
)

// chooseWays is the one place that decides a loader's GPU path and backend.
// It returns the ways Open tries, in order, each with why.
// With m nil it decides only what needs no map, for Validate.
func chooseWays(m *bmap.Map, o Options) ([]gpuWay, error) {
	ways, err := o.gpuWays()
	if err != nil || m == nil {
		return ways, err
	}
	ways = autoBackends(m, o, ways)
	for i := range ways {
		if err := ways[i].resolve(o); err != nil {
			if i == 0 {
				return nil, err
			}
			ways[i].err = err // only if the ways before it fail
		}
	}
	return ways, nil
}

// gpuWay is one way to open a loader: the GPU path, its backend, and why.
type gpuWay struct {
	path, backend, why string
	// auto: the backend was chosen for a loader that named none; the filesystem is next.
	auto       bool
	backendWhy string

	spec   backend.Spec
	params backend.Params
	err    error
}

// backendName is the backend o names: its Spec's, else Backend ("" for
// none named).
func (o Options) backendName() string {
	if o.Spec != nil {
		return o.Spec.Name
	}
	return o.Backend
}

// gpuWays returns the ways to try, in order. o has its defaults.
// GPUPathAuto with no backend named tries the first device writer, then bounce.
// Which backend takes GPUPathCuFile is what the backends declare, never their name.
func (o Options) gpuWays() ([]gpuWay, error) {
	name := o.backendName()
	if !o.Memory.OnGPU() {
		if o.GPUPath != "" {
			return nil, fmt.Errorf("%w: gpu_path %q applies to memory gpu only", ErrOptions, o.GPUPath)
		}
		return []gpuWay{{path: "", backend: name}}, nil
	}
	writes := o.Spec != nil && o.Spec.DeviceWrites
	if o.Spec == nil && name != "" {
		s, err := BackendSpec(name)
		writes = err == nil && s.DeviceWrites // an unknown name: New says so
	}
	switch o.GPUPath {
	case GPUPathCuFile:
		if name != "" && !writes {
			return nil, fmt.Errorf("%w: gpu_path cufile reads with a backend that writes the device itself, not %s (use gpu_path bounce for it)", ErrOptions, name)
		}
		if name == "" {
			if name = deviceWriter(); name == "" {
				return nil, fmt.Errorf("%w: gpu_path cufile: no backend here writes the device itself", ErrOptions)
			}
		}
		return []gpuWay{{path: GPUPathCuFile, backend: name, why: "asked for"}}, nil
	case GPUPathBounce:
		if writes {
			return nil, fmt.Errorf("%w: gpu_path bounce with backend %s: %s writes the device itself", ErrOptions, name, name)
		}
		return []gpuWay{{path: GPUPathBounce, backend: name, why: "asked for"}}, nil
	case "", GPUPathAuto:
		switch {
		case writes:
			return []gpuWay{{path: GPUPathCuFile, backend: name, why: "backend " + name + " named, which writes the device"}}, nil
		case name == "":
			if dw := deviceWriter(); dw != "" {
				return []gpuWay{{path: GPUPathCuFile, backend: dw, why: "auto: " + dw + " opens here"}, {path: GPUPathBounce, why: "auto: " + dw + " cannot run here or runs in compatibility mode"}}, nil
			}
			return []gpuWay{{path: GPUPathBounce, why: "auto: no backend here writes the device"}}, nil
		}
		return []gpuWay{{path: GPUPathBounce, backend: name, why: "auto: backend " + name + " named, which writes host memory"}}, nil
	}
	return nil, fmt.Errorf("%w: gpu_path %q (want %s, %s or %s)", ErrOptions, o.GPUPath, GPUPathAuto, GPUPathCuFile, GPUPathBounce)
}

// deviceWriter returns the first backend offered that writes the device
// itself (backend.Spec.DeviceWrites), "" for none.
func deviceWriter() string {
	for _, s := range Backends() {
		if s.DeviceWrites {
			return s.Name
		}
	}
	return ""
}

// autoBackends fills in the backend of every way naming none: the fastest the map allows.
// A block-device map with a raw sample gets AutoBackend, then a DefaultBackend way.
// Any other map, or options given without a backend name, gets DefaultBackend.
func autoBackends(m *bmap.Map, o Options, ways []gpuWay) []gpuWay {
	if o.backendName() != "" {
		return ways
	}
	why := ""
	switch {
	case len(o.BackendOptions) > 0:
		why = "backend_options without a backend name are " + DefaultBackend + "'s"
	case m.FSOnly():
		why = fmt.Sprintf("auto: the map's filesystem (%s) has no block device to read raw", m.Device.FSType)
	case !anyRaw(m):
		why = "auto: no sample is mapped raw"
	}
	out := make([]gpuWay, 0, 2*len(ways))
	for _, w := range ways {
		if w.backend != "" {
			out = append(out, w)
			continue
		}
		fs := w
		fs.backend = DefaultBackend
		if why != "" {
			fs.backendWhy = why
			out = append(out, fs)
			continue
		}
		raw := w
		raw.backend, raw.auto = AutoBackend, true
		raw.backendWhy = fmt.Sprintf("auto: raw reads from %s where the freshness guard allows, the filesystem as the caller for the rest", m.Device.Path)
		fs.backendWhy = "auto: " + AutoBackend + " did not open here"
		out = append(out, raw, fs)
	}
	return out
}

// anyRaw reports whether a sample of m is mapped raw (the first one
// found ends the search).
func anyRaw(m *bmap.Map) bool {
	for i := range m.Samples {
		if m.Samples[i].Reason == bmap.Raw {
			return true
		}
	}
	return false
}

// resolve looks up the way's backend (o's own Spec when it is the one o
// names) and checks o's backend options against it.
func (w *gpuWay) resolve(o Options) error {
	if o.Spec != nil && w.backend == o.backendName() {
		w.spec = *o.Spec
	} else {
		s, err := backendSpec(w.backend, o.CUDA)
		if err != nil {
			return err
		}
		w.spec = s
	}
	var err error
	w.params, err = w.spec.Resolve(o.BackendOptions)
	return err
}
