// SPDX-License-Identifier: Apache-2.0

package cufile

import (
	"errors"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/cuda"
)

// TestDecideMode: the GPU's mode comes from the statistics entry with its
// UUID (never another GPU's by position); where cuFile lists none or no
// reads yet, from the driver's properties; "unknown" always says why.
func TestDecideMode(t *testing.T) {
	const ours, other = "GPU-5354414e-4449-4e2d-4750-552d30303031", "GPU-5354414e-4449-4e2d-4750-552d30303030"
	nvfs := cuda.DriverProps{NVFSMajor: 2, NVFSMinor: 17}
	gds := cuda.GPUReads{UUID: ours, Total: 5, NVFS: 5}
	for _, tc := range []struct {
		name      string
		reads     []cuda.GPUReads
		readsErr  error
		props     cuda.DriverProps
		propsErr  error
		mode, why string
		p2p, psx  int64
	}{
		{name: "gds, matched by UUID not position", reads: []cuda.GPUReads{{UUID: other, Total: 3, POSIX: 3}, gds}, props: nvfs,
			mode: "gds", why: "cuFile's statistics for " + ours, p2p: 5},
		{name: "UUID in another case, without GPU-", reads: []cuda.GPUReads{{UUID: strings.ToUpper(ours[4:]), Total: 2, POSIX: 2}}, props: nvfs,
			mode: "compat", why: "2 POSIX reads", psx: 2},
		{name: "compat: no GPU listed, no nvidia-fs", props: cuda.DriverProps{}, mode: "compat", why: "nvidia-fs is not loaded (cuFileDriverGetProperties: nvidia-fs 0.0); cuFile lists no GPU"},
		{name: "compat: no GPU listed, nvidia-fs loaded", props: nvfs, mode: "compat", why: "compatibility mode builds no GPU topology"},
		{name: "listed, no reads yet, no nvidia-fs", reads: []cuda.GPUReads{{UUID: ours}}, mode: "compat", why: "nvidia-fs is not loaded"},
		{name: "listed, no reads yet", reads: []cuda.GPUReads{{UUID: ours}}, props: nvfs, mode: "none", why: "no reads yet (cuFileDriverGetProperties: nvidia-fs 2.17)"},
		{name: "others listed, not ours", reads: []cuda.GPUReads{{UUID: other, Total: 1, NVFS: 1}}, props: nvfs, mode: "unknown", why: "list " + other + ", not this session's GPU " + ours},
		{name: "statistics unreadable", readsErr: errors.New("cuFileGetStatsL3: CU_FILE_DRIVER_NOT_INITIALIZED"), mode: "unknown", why: "statistics unreadable: cuFileGetStatsL3"},
		{name: "nothing listed, properties unreadable", propsErr: errors.New("cuFileDriverGetProperties: CU_FILE_INTERNAL_ERROR"), mode: "unknown", why: "properties are unreadable: cuFileDriverGetProperties"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decideMode(ours, tc.reads, tc.readsErr, tc.props, tc.propsErr)
			if got.Mode != tc.mode || !strings.Contains(got.Why, tc.why) || got.P2P != tc.p2p || got.POSIX != tc.psx {
				t.Errorf("%+v, want mode %s because %q, %d direct and %d POSIX reads", got, tc.mode, tc.why, tc.p2p, tc.psx)
			}
		})
	}
}
