// SPDX-License-Identifier: Apache-2.0

package batchmem

import (
	"errors"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/cuda"
)

// TestPickDevice: a UUID picks its GPU's ordinal in this process, whatever
// ordinal the caller had; a UUID or ordinal not here is ErrUnknownGPU
// naming it and every GPU this process sees.
func TestPickDevice(t *testing.T) {
	devs := []cuda.Device{{Ordinal: 0, UUID: "GPU-5354414e-4449-4e2d-4750-552d30303031"}, {Ordinal: 1, UUID: "GPU-5354414e-4449-4e2d-4750-552d30303030"}}
	for _, tc := range []struct {
		name    string
		devs    []cuda.Device
		ordinal int
		uuid    string
		want    int
		refuse  []string
	}{
		{name: "by UUID", devs: devs, ordinal: 0, uuid: devs[1].UUID, want: 1},
		{name: "by UUID, upper case without GPU-", devs: devs, ordinal: 1, uuid: strings.ToUpper(devs[0].UUID[4:]), want: 0},
		{name: "by ordinal", devs: devs, ordinal: 1, want: 1},
		{name: "UUID not here", devs: devs, uuid: "GPU-00000000-0000-0000-0000-000000000000",
			refuse: []string{"GPU-00000000-0000-0000-0000-000000000000", "0: " + devs[0].UUID, "1: " + devs[1].UUID}},
		{name: "ordinal not here", devs: devs, ordinal: 2, refuse: []string{"ordinal 2", "1: " + devs[1].UUID}},
		{name: "no GPU", ordinal: 0, refuse: []string{"sees no GPU"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pickDevice(tc.devs, tc.ordinal, tc.uuid)
			if tc.refuse == nil {
				if err != nil || got != tc.want {
					t.Fatalf("%d %v, want %d", got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrUnknownGPU) {
				t.Fatalf("%v, want ErrUnknownGPU", err)
			}
			for _, w := range tc.refuse {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v: does not name %q", err, w)
				}
			}
		})
	}
}
