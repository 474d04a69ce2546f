// SPDX-License-Identifier: Apache-2.0

package standin

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/nvfeed/nvfeed/internal/cuda"
)

// TestReportCounts: a process (a Go one: it exits without running C
// destructors) that takes one of everything and exits leaves a report
// counting each, which Check names; one that gives everything back leaves
// a clean report but for its runtime context and open cuFile driver, which
// are not leaks; one that calls the driver before cuInit leaves the
// violation.
func TestReportCounts(t *testing.T) {
	all := map[string]int64{"allocations": 1, "imports": 1, "reservations": 1, "mappings": 1, "handles": 1,
		"primary_ctx_retains": 1, "host_registrations": 1, "streams": 1, "events": 1, "cufile_handles": 1, "cufile_buffers": 1}
	for _, c := range []struct {
		mode      string
		live      map[string]int64
		violation string
	}{
		{"leak", all, ""},
		{"clean", nil, ""},
		{"noinit", nil, "cuMemAddressReserve: cuInit has not been called"},
	} {
		t.Run(c.mode, func(t *testing.T) {
			_, reports := helper(t, "report", nil, "STANDIN_TEST_MODE="+c.mode, "STANDIN_TEST_DIR="+t.TempDir())
			r, err := ReadReports(reports)
			if err != nil || len(r) != 1 {
				t.Fatalf("reports %+v, %v: want one", r, err)
			}
			for name, n := range r[0].Live {
				if n != c.live[name] {
					t.Errorf("live %s = %d, want %d", name, n, c.live[name])
				}
			}
			if len(r[0].Live) != len(all) {
				t.Errorf("live counts %v, want the %d of %v", r[0].Live, len(all), slices.Sorted(maps.Keys(all)))
			}
			if c.mode != "noinit" && (r[0].RuntimeContexts != 1 || r[0].CuFileDriverOpen != 1) {
				t.Errorf("runtime contexts %d, cuFile driver open %d; want 1 and 1", r[0].RuntimeContexts, r[0].CuFileDriverOpen)
			}
			err = Check(reports)
			switch {
			case c.live == nil && c.violation == "" && err != nil:
				t.Errorf("Check of a clean process: %v", err)
			case c.live != nil && (err == nil || !strings.Contains(err.Error(), "allocations=1 cufile_buffers=1")):
				t.Errorf("Check of a leaking process: %v, want the leaks named", err)
			case c.violation != "" && (err == nil || !strings.Contains(err.Error(), c.violation)):
				t.Errorf("Check: %v, want the violation %q", err, c.violation)
			}
		})
	}
}

// helperReport takes one of everything (STANDIN_TEST_MODE leak), and
// gives it back (clean), or calls the driver before cuInit (noinit).
func helperReport(a *api) error {
	mode := os.Getenv("STANDIN_TEST_MODE")
	if mode == "noinit" {
		var p uintptr
		a.cuMemAddressReserve(&p, gran, 0, 0, 0)
		return nil
	}
	_, direct, _, err := writeFile(os.Getenv("STANDIN_TEST_DIR"), 4096)
	if err != nil {
		return err
	}
	var ctx, s, e, fh uintptr
	var fd int32
	var imported uint64
	var m devMem
	m.size = gran
	p := prop(0, 1, true)
	access := cuda.MemAccessDesc{Location: p.Location, Flags: 3}
	host, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	hp := addr(host)
	steps := []struct {
		call string
		do   func() uint64
		undo func() uint64
	}{
		{"cudaSetDevice", func() uint64 { return uint64(a.cudaSetDevice(0)) }, nil},
		{"cuFileDriverOpen", a.cuFileDriverOpen, nil},
		{"cuDevicePrimaryCtxRetain", func() uint64 { return uint64(a.cuPrimaryCtxRetain(&ctx, 0)) },
			func() uint64 { return uint64(a.cuPrimaryCtxRelease(0)) }},
		{"cuMemCreate", func() uint64 { return uint64(a.cuMemCreate(&m.h, gran, &p, 0)) },
			func() uint64 { return uint64(a.cuMemRelease(m.h)) }},
		{"cuMemAddressReserve", func() uint64 { return uint64(a.cuMemAddressReserve(&m.ptr, gran, 0, 0, 0)) },
			func() uint64 { return uint64(a.cuMemAddressFree(m.ptr, gran)) }},
		{"cuMemMap", func() uint64 {
			return uint64(a.cuMemMap(m.ptr, gran, 0, m.h, 0) | a.cuMemSetAccess(m.ptr, gran, &access, 1))
		},
			func() uint64 { return uint64(a.cuMemUnmap(m.ptr, gran)) }},
		{"cuMemExportToShareableHandle", func() uint64 { return uint64(a.cuMemExport(&fd, m.h, 1, 0)) },
			func() uint64 { return closeFd(int(fd)) }},
		{"cuMemImportFromShareableHandle", func() uint64 { return uint64(a.cuMemImport(&imported, uintptr(fd), 1)) },
			func() uint64 { return uint64(a.cuMemRelease(imported)) }},
		{"cuStreamCreate", func() uint64 { return uint64(a.cuStreamCreate(&s, 1)) },
			func() uint64 { return uint64(a.cuStreamDestroy(s)) }},
		{"cuEventCreate", func() uint64 { return uint64(a.cuEventCreate(&e, 3)) },
			func() uint64 { return uint64(a.cuEventDestroy(e)) }},
		{"cudaHostRegister", func() uint64 { return uint64(a.cudaHostRegister(hp, 4096, 1)) },
			func() uint64 { return uint64(a.cudaHostUnregister(hp)) }},
		{"cuFileHandleRegister", func() uint64 { return a.cuFileHandleRegister(&fh, &cuda.FileDescr{Type: 1, Handle: direct.Fd()}) },
			func() uint64 { a.cuFileHandleDeregister(fh); return 0 }},
		{"cuFileBufRegister", func() uint64 { return a.cuFileBufRegister(m.ptr, gran, 0) },
			func() uint64 { return a.cuFileBufDeregister(m.ptr) }},
	}
	for _, s := range steps {
		if r := s.do(); r != 0 {
			return fmt.Errorf("%s: %#x", s.call, r)
		}
	}
	if mode != "clean" {
		return nil
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if s := steps[i]; s.undo != nil {
			if r := s.undo(); r != 0 {
				return fmt.Errorf("undoing %s: %#x", s.call, r)
			}
		}
	}
	return nil
}

func closeFd(fd int) uint64 {
	if syscall.Close(fd) != nil {
		return 1
	}
	return 0
}

// TestBuildOnceConcurrently: builds of the same sources racing in one
// cache directory all return the same, complete directory.
func TestBuildOnceConcurrently(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dirs := make([]string, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range dirs {
		wg.Go(func() { dirs[i], errs[i] = build() })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if dirs[0] != dirs[1] || !strings.HasPrefix(dirs[0], os.Getenv("TMPDIR")) {
		t.Fatalf("builds into %q, want one directory under TMPDIR", dirs)
	}
	for _, lib := range []string{Driver, Runtime, CuFile} {
		if _, err := os.Stat(dirs[0] + "/" + lib); err != nil {
			t.Error(err)
		}
	}
	if again, err := build(); err != nil || again != dirs[0] {
		t.Errorf("a third build: %q, %v; want %q from the cache", again, err, dirs[0])
	}
	if left, _ := os.ReadDir(dirs[0] + "/.."); len(left) != 1 {
		t.Errorf("the cache holds %d entries, want the one build (no temporary left)", len(left))
	}
}

// TestEnv: the stand-in's settings of the caller's environment are
// dropped, the library and report directories set, and later extras win.
func TestEnv(t *testing.T) {
	t.Setenv(ModeVar, "compat")
	t.Setenv(VisibleVar, "3")
	env := Env("/lib", "/rep", VisibleVar+"=1", "X_STANDIN=1", "X_STANDIN=2")
	for _, want := range []string{LibDirVar + "=/lib", ReportVar + "=/rep", VisibleVar + "=1", "X_STANDIN=2"} {
		if n := countPrefix(env, want); n != 1 {
			t.Errorf("%q appears %d times, want once", want, n)
		}
	}
	for _, gone := range []string{ModeVar + "=", VisibleVar + "=3", "X_STANDIN=1"} {
		if n := countPrefix(env, gone); n != 0 {
			t.Errorf("%q kept", gone)
		}
	}
}

func countPrefix(env []string, p string) int {
	n := 0
	for _, kv := range env {
		if kv == p || strings.HasSuffix(p, "=") && strings.HasPrefix(kv, p) {
			n++
		}
	}
	return n
}
