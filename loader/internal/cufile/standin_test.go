// SPDX-License-Identifier: Apache-2.0

package cufile

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/cuda/standin"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// openOnStandin opens the cufile backend over GPU memory on ordinal 0
// (its own slot of 1 MiB) and returns it, the memory, the map and a log
// of what it said.
func openOnStandin(t *testing.T, root string) (*Backend, batchmem.Memory, *bmap.Map, *bytes.Buffer) {
	t.Helper()
	m := dataset(t, root)
	standin.ProvideCuFileHost(t, false, root)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	mem, err := batchmem.Open(batchmem.GPU, 1, 1<<20, batchmem.Options{DeviceWrites: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	d := mem.Desc()
	spec := Spec(nil)
	p, err := spec.Resolve(map[string]any{"workers": int64(3)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := spec.Open(m, p, backend.Env{Logger: log, GPU: &backend.GPUMemory{Device: d.Device, Base: mem.Slot(0).Dev, Size: d.Size, NUMANode: d.NUMANode}})
	if err != nil {
		mem.Close()
		t.Fatal(err)
	}
	return b.(*Backend), mem, m, &logs
}

// readAll reads every sample of the backend's map into the memory and
// checks each one's bytes at its device address against its file.
func readAll(t *testing.T, b *Backend, m *bmap.Map, root string) int {
	t.Helper()
	reqs, offs := requests(m, b.r.(*cuFileReader).mem.Base)
	if err := b.ReadBatch(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	base := b.r.(*cuFileReader).mem.Base
	for i, s := range m.Samples {
		want, _ := os.ReadFile(filepath.Join(root, s.Path))
		got := deviceBytes(base+uintptr(offs[i]), int(s.Size))
		if !bytes.Equal(got, want) {
			t.Fatalf("sample %d (%s): the device bytes differ from the file", i, s.Path)
		}
	}
	return len(reqs)
}

// TestStandinStatsDuringClose: a metrics scrape (Stats) while the backend
// closes, and after, answers (with the last statistics) instead of
// crashing the daemon; the memory's cuFile registration is undone.
func TestStandinStatsDuringClose(t *testing.T) {
	if !standin.InChild(t) {
		return
	}
	root := t.TempDir()
	b, mem, m, _ := openOnStandin(t, root)
	defer mem.Close()
	n := readAll(t, b, m, root)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 { // scrapes, all through the close
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					b.Stats()
				}
			}
		}()
	}
	if err := b.Close(); err != nil {
		t.Error(err)
	}
	close(stop)
	wg.Wait()
	st := b.Stats()
	if st.Label("cufile_mode") != "gds" || st.Counter("cufile_p2p_reads") < int64(n) || st.Counter("samples") != int64(n) {
		t.Errorf("stats after close: %+v, want the last statistics (gds, %d reads)", st, n)
	}
}

// TestStandinModeByUUID: cuFile lists its GPUs' statistics in its own
// order (the stand-in: reverse ordinals); the mode and counts are this
// GPU's, found by UUID, and the mode is measured at opening.
func TestStandinModeByUUID(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    []string
		mode   string
		why    string
		direct bool
	}{
		{"gds, GPU 1 first", []string{"CUDA_VISIBLE_DEVICES=1,0"}, "gds", "cuFile's statistics for GPU-", true},
		{"gds", nil, "gds", "cuFile's statistics for GPU-", true},
		{"compat", []string{standin.ModeVar + "=compat"}, "compat", "nvidia-fs is not loaded (cuFileDriverGetProperties: nvidia-fs 0.0)", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !standin.InChild(t, tc.env...) {
				return
			}
			root := t.TempDir()
			b, mem, m, _ := openOnStandin(t, root)
			defer mem.Close()
			defer b.Close()
			mode, why := b.Mode()
			if mode != tc.mode || !strings.Contains(why, tc.why) {
				t.Errorf("at opening: mode %s (%s), want %s (%s)", mode, why, tc.mode, tc.why)
			}
			n := readAll(t, b, m, root)
			st := b.Stats()
			direct, posix := st.Counter("cufile_p2p_reads"), st.Counter("cufile_posix_reads")
			if st.Label("cufile_mode") != tc.mode || (tc.direct && (direct < int64(n) || posix != 0)) || (!tc.direct && (direct != 0 || posix < int64(n))) {
				t.Errorf("after %d reads: %+v, want mode %s", n, st, tc.mode)
			}
			if mode == "gds" && !strings.Contains(why, mem.Desc().UUID) {
				t.Errorf("%s: does not name the GPU %s", why, mem.Desc().UUID)
			}
		})
	}
}

// TestStandinBufRegisterRefused: cuFile refusing the memory's
// registration is a warning, not a failure: reads go through cuFile's own
// buffers, and Close deregisters nothing (deregistering what is not
// registered breaks cuFile's rules).
func TestStandinBufRegisterRefused(t *testing.T) {
	if !standin.InChild(t, standin.FailVar+"=bufregister") {
		return
	}
	root := t.TempDir()
	b, mem, m, logs := openOnStandin(t, root)
	defer mem.Close()
	if b.r.(*cuFileReader).registered || !strings.Contains(logs.String(), "not registered with cuFile") || !strings.Contains(logs.String(), "CU_FILE_INTERNAL_BUF_REGISTER_ERROR") {
		t.Errorf("the refusal is not logged as a warning naming the error:\n%s", logs.String())
	}
	readAll(t, b, m, root)
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// deviceBytes is n bytes at a device address of the stand-in, whose
// device memory is mapped in this process.
func deviceBytes(p uintptr, n int) []byte {
	return unsafe.Slice((*byte)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}

// TestStandinPreconditions: cuFile is refused before it is used where the
// host does not meet a precondition real cuFile needs, with an error that
// names it and how to provide it (ErrUnavailable, for gpu_path auto's
// fallback): no /proc/modules (real cuFileDriverOpen spins forever), no
// udev record of the dataset's device (real cuFile refuses every handle,
// 5027); a driver open that never returns costs its timeout once, and
// every later open is refused at once with the same reason.
func TestStandinPreconditions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []string
		host    func(h *cuda.CuFileHost)
		want    error
		message string
	}{
		{"no /proc/modules", nil, func(h *cuda.CuFileHost) { h.Proc = t.TempDir() }, cuda.ErrCuFilePrecondition, "modules (a kernel without loadable modules): cuFile's driver open would hang on this kernel"},
		{"no udev record", nil, func(h *cuda.CuFileHost) { h.Udev = t.TempDir() }, cuda.ErrCuFilePrecondition, "no udev record for the dataset's filesystem (block device b"},
		{"a driver open that hangs", []string{standin.FailVar + "=driveropen-hang"}, func(h *cuda.CuFileHost) { h.OpenTimeout = time.Second }, cuda.ErrCuFileDriverStuck, "cuFileDriverOpen did not return within 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !standin.InChild(t, tc.env...) {
				return
			}
			root := t.TempDir()
			m := dataset(t, root)
			standin.ProvideCuFileHost(t, false, root)
			h := cuda.CuFileHostFromEnv()
			tc.host(&h)
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			libs := cuda.NewLibs(cuda.SearchFromEnv(), log, cuda.WithCuFileHost(h))
			mem, err := batchmem.Open(batchmem.GPU, 1, 1<<20, batchmem.Options{DeviceWrites: true, Logger: log, CUDA: libs})
			if err != nil {
				t.Fatal(err)
			}
			defer mem.Close()
			d := mem.Desc()
			spec := Spec(libs)
			p, err := spec.Resolve(nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				start := time.Now()
				b, err := spec.Open(m, p, backend.Env{Logger: log, GPU: &backend.GPUMemory{Device: d.Device, Base: mem.Slot(0).Dev, Size: d.Size, NUMANode: d.NUMANode, Driver: libs}}) // third parties see libs as the Driver
				took := time.Since(start)
				if err == nil {
					b.Close()
					t.Fatalf("open %d: cuFile taken", i)
				}
				if !errors.Is(err, ErrUnavailable) || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.message) {
					t.Errorf("open %d: %v; want ErrUnavailable and %v, saying %q", i, err, tc.want, tc.message)
				}
				if limit := []time.Duration{5 * time.Second, time.Second}[i]; took > limit {
					t.Errorf("open %d took %v, want under %v", i, took, limit)
				}
			}
		})
	}
}
