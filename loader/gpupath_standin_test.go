// SPDX-License-Identifier: Apache-2.0

package loader

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestStandinAutoMeasuresCuFile: gpu_path auto keeps cufile where cuFile
// runs peer to peer, and takes bounce where it runs in its compatibility
// mode (slower than bounce), saying why in GPUPath and the log; a
// cufile asked for is kept either way, with the mode in its reason.
func TestStandinAutoMeasuresCuFile(t *testing.T) {
	for _, tc := range []struct {
		name, mode, gpuPath string
		path, why           string
	}{
		{"gds", "gds", GPUPathAuto, GPUPathCuFile, "auto: cufile opens here; cufile mode gds (cuFile's statistics for GPU-"},
		{"compat", "compat", GPUPathAuto, GPUPathBounce, "auto: cufile runs in compatibility mode ("},
		{"compat, cufile asked for", "compat", GPUPathCuFile, GPUPathCuFile, "asked for; cufile mode compat ("},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !standin.InChild(t, standin.ModeVar+"="+tc.mode) {
				return
			}
			m := makeDataset(t, 24, 3, 3000)
			standin.ProvideCuFileHost(t, false, m.Root)
			var logs bytes.Buffer
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4}, Memory: batchmem.GPU, GPUPath: tc.gpuPath,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			path, why := l.GPUPath()
			if path != tc.path || !strings.HasPrefix(why, tc.why) {
				t.Errorf("GPUPath() = %s, %q; want %s, %q...", path, why, tc.path, tc.why)
			}
			// compatibility mode is told by the GPU's POSIX reads in cuFile's
			// statistics where it lists the GPU (as real cuFile does once it
			// has read), else by the driver's properties (no nvidia-fs)
			if tc.mode == "compat" && !strings.Contains(why, "POSIX reads") && !strings.Contains(why, "nvidia-fs is not loaded") {
				t.Errorf("GPUPath()'s reason %q says neither cuFile's POSIX reads nor the missing nvidia-fs", why)
			}
			if tc.path == GPUPathBounce && !strings.Contains(logs.String(), "cufile runs in compatibility mode") {
				t.Errorf("the log does not say why bounce:\n%s", logs.String())
			}
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			b.Release()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStandinCuFilePreconditionsUnmet: on a kernel without /proc/modules
// (where real cuFileDriverOpen never returns) and where a driver open
// hangs, gpu_path auto reaches bounce within seconds with the reason in
// GPUPath and the log, and gpu_path cufile gets an error naming the
// precondition.
func TestStandinCuFilePreconditionsUnmet(t *testing.T) {
	for _, tc := range []struct {
		name, gpuPath string
		env           []string
		noModules     bool
		why           string
	}{
		{"no /proc/modules, auto", GPUPathAuto, nil, true, "cuFile's driver open would hang on this kernel"},
		{"no /proc/modules, cufile", GPUPathCuFile, nil, true, "cuFile's driver open would hang on this kernel"},
		{"driver open hangs, auto", GPUPathAuto, []string{standin.FailVar + "=driveropen-hang"}, false, "cuFileDriverOpen did not return within 2s"},
		{"driver open hangs, cufile", GPUPathCuFile, []string{standin.FailVar + "=driveropen-hang"}, false, "cuFileDriverOpen did not return within 2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !standin.InChild(t, tc.env...) {
				return
			}
			m := makeDataset(t, 24, 3, 3000)
			standin.ProvideCuFileHost(t, false, m.Root)
			h := cuda.CuFileHostFromEnv()
			h.OpenTimeout = 2 * time.Second
			if tc.noModules {
				h.Proc = t.TempDir()
			}
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			start := time.Now()
			l, err := New(context.Background(), m, Options{ReaderArgs: ReaderArgs{BatchSize: 4}, Memory: batchmem.GPU, GPUPath: tc.gpuPath,
				Logger: log, CUDA: cuda.NewLibs(cuda.SearchFromEnv(), log, cuda.WithCuFileHost(h))})
			if took := time.Since(start); took > 6*time.Second {
				t.Errorf("the open took %v", took)
			}
			if tc.gpuPath == GPUPathCuFile {
				if err == nil {
					l.Close()
					t.Fatal("gpu_path cufile opened")
				}
				if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), tc.why) {
					t.Errorf("error %v, want ErrUnavailable saying %q", err, tc.why)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			path, why := l.GPUPath()
			if path != GPUPathBounce || !strings.Contains(why, tc.why) {
				t.Errorf("GPUPath() = %s, %q; want bounce saying %q", path, why, tc.why)
			}
			if !strings.Contains(logs.String(), tc.why) {
				t.Errorf("the log does not say why bounce:\n%s", logs.String())
			}
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			b.Release()
		})
	}
}
