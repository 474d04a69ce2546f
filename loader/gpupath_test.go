// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestGPUPaths: which ways a loader is opened in, by memory, gpu_path and
// backend; contradictions are refused naming them.
func TestGPUPaths(t *testing.T) {
	tests := []struct {
		memory  batchmem.Kind
		path    string
		backend string
		want    []string // path/backend tried, in order
		refuse  string
	}{
		{"", "", "gds", []string{"/gds"}, ""},
		{"pinned", "cufile", "", nil, "applies to memory gpu only"},
		{"gpu", "", "", []string{"cufile/cufile", "bounce/"}, ""},
		{"gpu", "auto", "", []string{"cufile/cufile", "bounce/"}, ""},
		{"gpu", "auto", "bam", []string{"bounce/bam"}, ""},
		{"gpu", "auto", "cufile", []string{"cufile/cufile"}, ""},
		{"gpu", "cufile", "", []string{"cufile/cufile"}, ""},
		{"gpu", "cufile", "gds", nil, "not gds"},
		{"gpu", "bounce", "", []string{"bounce/"}, ""},
		{"gpu", "bounce", "file", []string{"bounce/file"}, ""},
		{"gpu", "bounce", "cufile", nil, "writes the device itself"},
		{"gpu", "p2p", "", nil, `gpu_path "p2p"`},
	}
	for _, tt := range tests {
		t.Run(string(tt.memory)+"/"+tt.path+"/"+tt.backend, func(t *testing.T) {
			o := Options{ReaderArgs: ReaderArgs{BatchSize: 1}, Memory: tt.memory, GPUPath: tt.path, Backend: tt.backend}.WithDefaults()
			got, err := o.gpuWays()
			if verr := o.Validate(); (verr == nil) != (err == nil) || (err != nil && verr.Error() != err.Error()) {
				t.Errorf("Validate: %v, want what the ways say: %v", verr, err)
			}
			if tt.refuse != "" {
				if !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), tt.refuse) {
					t.Fatalf("err = %v, want ErrOptions mentioning %q", err, tt.refuse)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, c := range got {
				names = append(names, c.path+"/"+c.backend)
				if c.path != "" && c.why == "" {
					t.Errorf("%s: no reason given", c.path)
				}
			}
			if !slices.Equal(names, tt.want) {
				t.Errorf("tried %v, want %v", names, tt.want)
			}
		})
	}
}

// TestGPUPathHost: a loader on host memory takes no GPU path, and says so.
func TestGPUPathHost(t *testing.T) {
	m := makeDataset(t, 8, 2, 100)
	l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if path, why := l.GPUPath(); path != "" || why != "" {
		t.Errorf("GPUPath() = %q, %q on host memory, want nothing", path, why)
	}
}

// TestDeviceUUIDForm: a GPU UUID in any case, with or without GPU-, passes
// Validate; anything else, or too long, is refused naming device_uuid.
func TestDeviceUUIDForm(t *testing.T) {
	for u, ok := range map[string]bool{
		"": true, "GPU-5354414e-4449-4e2d-4750-552d30303031": true, "5354414E-4449-4E2D-4750-552D30303031": true,
		"GPU-../../etc": false, "GPU 1": false, strings.Repeat("a", MaxDeviceUUID+1): false,
	} {
		err := Options{ReaderArgs: ReaderArgs{BatchSize: 1}, Memory: batchmem.GPU, DeviceUUID: u}.WithDefaults().Validate()
		if (err == nil) != ok || (err != nil && (!errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "device_uuid"))) {
			t.Errorf("device_uuid %q: %v, want ok=%v (ErrOptions naming device_uuid)", u, err, ok)
		}
	}
}
