// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// moder is a backend that measures how it reaches the GPU: the cufile
// backend (cuFile's mode: gds, compat, mixed, none, unknown) and why.
type moder interface {
	Mode() (mode, why string)
}

// cufileCompat is the mode in which cuFile reads with POSIX reads into
// its own bounce buffers and copies: slower than the bounce path's one
// copy per batch.
const cufileCompat = "compat"

// openGPUPath opens p's loader on the first of its GPU ways that works.
// Under GPUPathAuto, cufile is kept only
// where cuFile opens and does not run in its compatibility mode, measured
// at its opening; else bounce, with the reason logged and in GPUPath.
func openGPUPath(ctx context.Context, p Plan) (*Loader, error) {
	o := p.Options
	ways := slices.Clone(p.ways)
	var err error
	for i, w := range ways {
		last := i+1 == len(ways)
		var l *Loader
		if l, err = open(ctx, p, w); err != nil {
			if !last && errors.Is(err, ErrUnavailable) {
				why := fmt.Sprintf("cufile cannot run here (%v): bounce", err)
				o.Logger.Info("loader: gpu_path auto: " + why)
				ways[i+1].why = "auto: " + why
				continue
			}
			return nil, err
		}
		l.gpuPath, l.gpuWhy = w.path, w.why
		md, ok := l.backend.(moder)
		if w.path != GPUPathCuFile || !ok {
			return l, nil
		}
		mode, why := md.Mode()
		if !last && mode == cufileCompat {
			reason := fmt.Sprintf("cuFile runs in compatibility mode (%s): bounce", why)
			o.Logger.Info("loader: gpu_path auto: " + reason)
			if cerr := l.Close(); cerr != nil {
				o.Logger.Warn("loader: closing the cufile loader", "err", cerr)
			}
			ways[i+1].why = "auto: " + reason
			continue
		}
		l.gpuWhy = fmt.Sprintf("%s; cuFile mode %s (%s)", w.why, mode, why)
		if mode == cufileCompat {
			o.Logger.Warn("loader: gpu_path cufile: cuFile runs in compatibility mode, slower than gpu_path bounce", "why", why)
		}
		return l, nil
	}
	return nil, err
}
