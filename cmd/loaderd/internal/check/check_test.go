// SPDX-License-Identifier: Apache-2.0

package check

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

func TestCheckReport(t *testing.T) {
	datasets := map[string]string{}
	fs := testfs.New(t, testfs.Ext4()) // skips, saying why, without root or loop devices
	fs.WriteFile(t, "train/a/x.jpg", bytes.Repeat([]byte{1}, 10000))
	fs.Sync(t)
	m, err := bmap.Build(t.Context(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "train.bmap")
	if _, err := bmap.WriteFile(path, m, bmap.FormatBinary); err != nil {
		t.Fatal(err)
	}
	datasets["train"] = path
	r, err := Run(Options{Datasets: datasets})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Datasets) != 1 {
		t.Fatalf("%d datasets reported", len(r.Datasets))
	}
	d := r.Datasets[0]
	if !d.Fresh.OK || !d.ODirect.OK || d.Device != fs.Dev || d.Place.PCIPath != "" || d.RawShare != 1 {
		t.Errorf("dataset: %+v, want a fresh map, O_DIRECT reads, %s as a virtual device, all raw", d, fs.Dev)
	}
	if r.Go == "" || r.Kernel == "" || r.Seccomp == "" {
		t.Errorf("report lacks the basics: %+v", r)
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err != nil {
		if r.Driver.OK || r.CUDA.OK || len(r.GPUs) != 0 {
			t.Errorf("no driver here, yet: driver %+v cuda %+v gpus %v", r.Driver, r.CUDA, r.GPUs)
		}
		var text bytes.Buffer
		r.WriteText(&text)
		if !strings.Contains(text.String(), "no NVIDIA driver") {
			t.Errorf("text does not say there is no driver:\n%s", text.String())
		}
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back["datasets"] == nil || back["nvidia_driver"] == nil {
		t.Errorf("JSON: %v %s", err, js.String())
	}
	// A map that cannot be loaded fails the check, naming it.
	if _, err := Run(Options{Datasets: map[string]string{"bad": filepath.Join(t.TempDir(), "none.bmap")}}); err == nil || !strings.Contains(err.Error(), "dataset bad") {
		t.Errorf("a missing map file: %v, want an error naming the dataset", err)
	}
}
