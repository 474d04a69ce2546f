// SPDX-License-Identifier: Apache-2.0

// Package standin builds and reads the strict CUDA stand-in, for tests.
// It is C libraries over host memory standing in for libcuda, libcudart and libcufile.
// Device memory is a memfd, handles are real descriptors, mappings are real.
// It fails loudly wherever NVIDIA documents a precondition, and counts what a process holds.
//
// Build compiles the libraries once per source hash with the system C
// compiler. A test points the library discovery at the result
// (NVFEED_CUDA_LIB_DIR, see Env). At the end it asserts with CheckClean
// that no process broke a rule or leaked. The stand-in reads:
//
//   - CUDA_STANDIN_GPUS: physical GPUs (default 2). GPU i's UUID is the 16
//     bytes "STANDIN-GPU-000" + hex digit i, its PCI bus id 0000:1i:00.0.
//   - CUDA_VISIBLE_DEVICES: honoured as CUDA does, with indices or GPU-
//     UUID prefixes.
//   - CUDA_STANDIN_REPORT=DIR: each process keeps DIR/<pid>.json (a Report)
//     up to date.
//   - CUFILE_STANDIN_MODE: gds (default) or compat.
//   - CUDA_STANDIN_RDMA: device attribute 110 (default 1).
//   - CUFILE_STANDIN_FAIL: injected failures, a comma list of bufregister
//     and read-eio.
//
// libcuda.so.1 also exports two test hooks. cuStandinLaunchRead(stream,
// src, n, delay_us, host_dst) is a consumer's "kernel": it sleeps on the
// stream and then copies device bytes to the host. cuStandinReport(buf,
// len) gives the process's report as JSON.
package standin

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The environment variables the stand-in and the library discovery read.
const (
	LibDirVar  = "NVFEED_CUDA_LIB_DIR"
	ReportVar  = "CUDA_STANDIN_REPORT"
	GPUsVar    = "CUDA_STANDIN_GPUS"
	VisibleVar = "CUDA_VISIBLE_DEVICES"
	ModeVar    = "CUFILE_STANDIN_MODE"
	RDMAVar    = "CUDA_STANDIN_RDMA"
	FailVar    = "CUFILE_STANDIN_FAIL"
)

// The libraries Build produces, by file name.
const (
	Driver  = "libcuda.so.1"
	Runtime = "libcudart.so.13"
	CuFile  = "libcufile.so.0"
)

// The C sources live in csrc/: the go command refuses .c files without cgo.
//
//go:embed csrc
var sources embed.FS

var sourceNames = []string{"build.sh", "standin.h", "cuda.c", "cudart.c", "cufile.c"}

// Build compiles the stand-in once per source hash into a shared cache and returns its directory.
// A missing C compiler fails tb: scripts/deps.sh installs one.
func Build(tb testing.TB) string {
	tb.Helper()
	dir, err := build()
	if err != nil {
		tb.Fatalf("standin: %v", err)
	}
	return dir
}

func build() (string, error) {
	h := sha256.New()
	for _, name := range sourceNames {
		b, err := sources.ReadFile("csrc/" + name)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	cache := filepath.Join(os.TempDir(), "nvfeed-cuda-standin")
	dir := filepath.Join(cache, sum)
	if _, err := os.Stat(filepath.Join(dir, CuFile)); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	// Build in a directory of its own, then rename it into place: a
	// concurrent build of the same sources loses the rename and uses the
	// winner's.
	tmp, err := os.MkdirTemp(cache, sum+".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src, out := filepath.Join(tmp, "src"), filepath.Join(tmp, "out")
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", err
	}
	for _, name := range sourceNames {
		b, _ := sources.ReadFile("csrc/" + name)
		if err := os.WriteFile(filepath.Join(src, name), b, 0o755); err != nil {
			return "", err
		}
	}
	if _, err := exec.LookPath(cc()); err != nil {
		return "", fmt.Errorf("no C compiler to build the CUDA stand-in (scripts/deps.sh installs gcc): %w", err)
	}
	cmd := exec.Command("bash", filepath.Join(src, "build.sh"), out)
	if o, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the CUDA stand-in: %v\n%s", err, o)
	}
	if err := os.Rename(out, dir); err != nil {
		if _, serr := os.Stat(filepath.Join(dir, CuFile)); serr != nil {
			return "", fmt.Errorf("installing the CUDA stand-in into %s: %w", dir, err)
		}
	}
	return dir, nil
}

func cc() string {
	if c := os.Getenv("CC"); c != "" {
		return strings.Fields(c)[0]
	}
	return "cc"
}

// Env returns the environment for a process loading the stand-in of dir and reporting into reportDir.
// Stand-in settings are cleared first; extra "NAME=value" entries come last and win.
func Env(dir, reportDir string, extra ...string) []string {
	set := append([]string{LibDirVar + "=" + dir, ReportVar + "=" + reportDir}, extra...)
	ours := []string{LibDirVar, ReportVar, GPUsVar, VisibleVar, ModeVar, RDMAVar, FailVar}
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(ours, name) && !slices.ContainsFunc(set, func(s string) bool { return strings.HasPrefix(s, name+"=") }) {
			env = append(env, kv)
		}
	}
	seen := map[string]int{}
	for _, kv := range set {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := seen[name]; ok {
			env[i] = kv
			continue
		}
		seen[name] = len(env)
		env = append(env, kv)
	}
	return env
}

// Report is what one process left in the report directory.
type Report struct {
	PID  int    `json:"pid"`
	Exe  string `json:"exe"`
	Path string `json:"-"` // the file it was read from

	// Live counts what the process still holds, by name: allocations, mappings, handles and more.
	Live map[string]int64 `json:"live"`

	CuFileDriverOpen int64    `json:"cufile_driver_open"` // left open for the process's life: not a leak
	RuntimeContexts  int64    `json:"runtime_contexts"`   // bound by cudaSetDevice until exit: not a leak
	Violations       []string `json:"violations"`
	SpinningEvents   int64    `json:"spinning_events"` // events waited on without BlockingSync
	Copies           int64    `json:"copies"`          // as of the last rewrite
	CuFileReads      int64    `json:"cufile_reads"`    // as of the last rewrite
	// ContextSynchronizes counts cuCtxSynchronize calls (cudaDeviceSynchronize's
	// too), as of the last rewrite: each one a wait for the whole context.
	ContextSynchronizes int64 `json:"context_synchronizes"`
}

// Leaks lists the live counts that are not zero, "name=N", sorted.
func (r Report) Leaks() []string {
	var out []string
	for name, n := range r.Live {
		if n != 0 {
			out = append(out, fmt.Sprintf("%s=%d", name, n))
		}
	}
	slices.Sort(out)
	return out
}

// ReadReports reads every process's report in dir, by pid.
func ReadReports(dir string) ([]Report, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []Report
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		r := Report{Path: p}
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("standin: report %s: %w", p, err)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Report) int { return a.PID - b.PID })
	return out, nil
}

// ErrNoReports is returned (wrapped) by Check when no process reported:
// the stand-in was not loaded.
var ErrNoReports = errors.New("no process loaded the CUDA stand-in")

// Check returns an error naming every violation and every leak (a live
// count that is not zero) of the reports in reportDir, or ErrNoReports.
func Check(reportDir string) error {
	reports, err := ReadReports(reportDir)
	if err != nil {
		return err
	}
	if len(reports) == 0 {
		return fmt.Errorf("standin: %w (no report in %s)", ErrNoReports, reportDir)
	}
	var errs []error
	for _, r := range reports {
		for _, v := range r.Violations {
			errs = append(errs, fmt.Errorf("pid %d (%s): violation: %s", r.PID, r.Exe, v))
		}
		if l := r.Leaks(); len(l) > 0 {
			errs = append(errs, fmt.Errorf("pid %d (%s): still held at its last report: %s", r.PID, r.Exe, strings.Join(l, " ")))
		}
	}
	return errors.Join(errs...)
}

// CheckClean fails tb unless at least one process reported into reportDir
// and none broke a rule or left anything allocated, mapped, registered or
// created (runtime contexts and an open cuFile driver are not leaks).
func CheckClean(tb testing.TB, reportDir string) {
	tb.Helper()
	if err := Check(reportDir); err != nil {
		tb.Errorf("CUDA stand-in: %v", err)
	}
}

// ChildVar names the test a re-executed test binary runs with the
// stand-in loaded (InChild).
const ChildVar = "NVFEED_STANDIN_TEST"

// InChild runs the calling test again in a child that loads the stand-in with settings extra.
// It checks the child passed and CheckClean holds. It returns true in the child, false in the parent.
func InChild(t *testing.T, extra ...string) bool {
	t.Helper()
	if os.Getenv(ChildVar) == t.Name() {
		return true
	}
	dir := Build(t)
	reports := t.TempDir()
	var pat []string
	for _, p := range strings.Split(t.Name(), "/") {
		pat = append(pat, "^"+regexp.QuoteMeta(p)+"$")
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(pat, "/"), "-test.count=1", "-test.v")
	cmd.Env = Env(dir, reports, append([]string{ChildVar + "=" + t.Name()}, extra...)...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("with the stand-in (%s): %v\n%s", strings.Join(extra, " "), err, out)
	}
	t.Logf("with the stand-in (%s):\n%s", strings.Join(extra, " "), out)
	CheckClean(t, reports)
	return false
}

// ProvideCuFileHost gives cuFile a host that meets its preconditions, through tb.Setenv.
// It makes a procfs modules file listing nvidia_fs and a udev record for each of dirs' devices.
// It returns the environment entries, for a child process.
func ProvideCuFileHost(tb testing.TB, nvfs bool, dirs ...string) []string {
	tb.Helper()
	root := tb.TempDir()
	modules := "ext4 1003520 1 - Live 0x0000000000000000\n"
	if nvfs {
		modules += "nvidia_fs 262144 0 - Live 0x0000000000000000\n"
	}
	proc, udev := filepath.Join(root, "proc"), filepath.Join(root, "udev")
	if err := os.MkdirAll(filepath.Join(udev, "data"), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(proc, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "modules"), []byte(modules), 0o644); err != nil {
		tb.Fatal(err)
	}
	for _, d := range dirs {
		var st syscall.Stat_t
		if err := syscall.Stat(d, &st); err != nil {
			tb.Fatal(err)
		}
		rec := fmt.Sprintf("b%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
		if err := os.WriteFile(filepath.Join(udev, "data", rec), []byte("E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n"), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	env := []string{"NVFEED_CUFILE_PROC=" + proc, "NVFEED_CUFILE_UDEV=" + udev}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		tb.Setenv(k, v)
	}
	return env
}
