// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nvfeed/nvfeed/loader/backend"
)

// MaxDeviceUUID bounds DeviceUUID's length (a GPU UUID is 40 characters,
// GPU- and 36).
const MaxDeviceUUID = 64

// checkDeviceUUID checks DeviceUUID's form: letters, digits and dashes,
// at most MaxDeviceUUID of them. Whether the GPU is here is batch
// memory's to say.
func checkDeviceUUID(u string) error {
	if len(u) > MaxDeviceUUID {
		return fmt.Errorf("%w: device_uuid of %d characters, at most %d", ErrOptions, len(u), MaxDeviceUUID)
	}
	for _, c := range u {
		if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("%w: device_uuid %q: want a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)", ErrOptions, u)
		}
	}
	return nil
}

// openGPUPath opens p's loader on the first of its GPU ways that works.
// Under GPUPathAuto, the backend writing the device is kept only where it
// opens (not backend.ErrUnavailable) and, if its Spec says MeasuresMode,
// does not report backend.ModeCompat at its opening; else bounce, with
// the reason logged and in GPUPath.
func openGPUPath(ctx context.Context, p Plan) (*Loader, error) {
	o := p.Options
	ways := slices.Clone(p.ways)
	var err error
	for i, w := range ways {
		last := i+1 == len(ways)
		var l *Loader
		if l, err = open(ctx, p, w); err != nil {
			if !last && w.auto && ctx.Err() == nil {
				why := fmt.Sprintf("auto: %s did not open here (%v): %s", w.backend, err, ways[i+1].backend)
				o.Logger.Info("loader: backend " + why)
				ways[i+1].backendWhy = why
				if ways[i+1].path == w.path {
					ways[i+1].why = w.why
				}
				continue
			}
			if !last && errors.Is(err, ErrUnavailable) {
				why := fmt.Sprintf("%s cannot run here (%v): bounce", w.backend, err)
				o.Logger.Info("loader: gpu_path auto: " + why)
				ways[i+1].why = "auto: " + why
				continue
			}
			return nil, err
		}
		l.gpuPath, l.gpuWhy, l.backendWhy = w.path, w.why, w.backendWhy
		if w.path != GPUPathCuFile || !l.spec.MeasuresMode {
			return l, nil
		}
		md, ok := l.backend.(backend.ModeReporter)
		if !ok {
			l.Close()
			return nil, fmt.Errorf("loader: backend %s: its Spec says MeasuresMode but it has no Mode (backend.ModeReporter)", w.backend)
		}
		mode, why := md.Mode()
		if !last && (mode == backend.ModeCompat || mode == backend.ModeNone || mode == backend.ModeUnknown) {
			reason := fmt.Sprintf("%s runs in compatibility mode (%s): bounce", w.backend, why)
			if mode != backend.ModeCompat {
				reason = fmt.Sprintf("%s's mode could not be measured (%s, %s): bounce", w.backend, mode, why)
			}
			o.Logger.Info("loader: gpu_path auto: " + reason)
			if cerr := l.Close(); cerr != nil {
				o.Logger.Warn("loader: closing the loader", "backend", w.backend, "err", cerr)
			}
			ways[i+1].why = "auto: " + reason
			continue
		}
		l.gpuWhy = fmt.Sprintf("%s; %s mode %s (%s)", w.why, w.backend, mode, why)
		if mode == backend.ModeCompat {
			o.Logger.Warn("loader: gpu_path cufile: the backend runs in compatibility mode, slower than gpu_path bounce", "backend", w.backend, "why", why)
		}
		return l, nil
	}
	return nil, err
}
