// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cuFile's host preconditions, checked before cuFile is chosen, as KvikIO
// guards them: libcufile's cuFileDriverOpen reads /proc/modules (whether
// nvidia_fs is loaded) and, on a kernel without that file, spins forever;
// cuFileHandleRegister reads the udev record of the file's block device
// (/run/udev/data/b<major>:<minor>, its ID_FS_USAGE) and, without it,
// refuses every handle ("udev property not found: ID_FS_USAGE", 5027),
// in compatibility mode too.

// ErrCuFilePrecondition is wrapped by the error of a cuFile precondition
// the host does not meet: its message names the precondition and how to
// provide it.
var ErrCuFilePrecondition = errors.New("cuFile precondition not met")

// ErrCuFileDriverStuck is wrapped by the error of a cuFileDriverOpen that
// did not return in time: cuFile is unusable for the process's life.
var ErrCuFileDriverStuck = errors.New("cuFileDriverOpen did not return")

// DefaultCuFileOpenTimeout bounds cuFileDriverOpen (a real one returns in
// well under a second, compatibility mode included).
const DefaultCuFileOpenTimeout = 10 * time.Second

// CuFileHost says where cuFile's host preconditions are read and how long
// cuFileDriverOpen may take. libcufile itself always reads /proc and
// /run/udev: other roots are for tests (with the CUDA stand-in, whose
// cuFile reads CUFILE_STANDIN_UDEV) and for hosts where the daemon sees
// those trees elsewhere.
type CuFileHost struct {
	Proc        string        // procfs: "/proc"
	Udev        string        // udev's run directory: "/run/udev"
	OpenTimeout time.Duration // cuFileDriverOpen's bound: DefaultCuFileOpenTimeout
}

// DefaultCuFileHost returns the production host: /proc, /run/udev and
// DefaultCuFileOpenTimeout.
func DefaultCuFileHost() CuFileHost {
	return CuFileHost{Proc: "/proc", Udev: "/run/udev", OpenTimeout: DefaultCuFileOpenTimeout}
}

// The environment variables CuFileHostFromEnv reads.
const (
	EnvCuFileProc = "NVFEED_CUFILE_PROC" // CuFileHost.Proc
	EnvCuFileUdev = "NVFEED_CUFILE_UDEV" // CuFileHost.Udev (the CUDA stand-in's cuFile reads it too)
)

// CuFileHostFromEnv returns DefaultCuFileHost with Proc and Udev taken
// from NVFEED_CUFILE_PROC and NVFEED_CUFILE_UDEV where they are set (for
// tests, and hosts whose trees the daemon sees elsewhere).
func CuFileHostFromEnv() CuFileHost {
	h := DefaultCuFileHost()
	if v := os.Getenv(EnvCuFileProc); v != "" {
		h.Proc = v
	}
	if v := os.Getenv(EnvCuFileUdev); v != "" {
		h.Udev = v
	}
	return h
}

// withDefaults fills h's zero fields from DefaultCuFileHost.
func (h CuFileHost) withDefaults() CuFileHost {
	d := DefaultCuFileHost()
	if h.Proc == "" {
		h.Proc = d.Proc
	}
	if h.Udev == "" {
		h.Udev = d.Udev
	}
	if h.OpenTimeout <= 0 {
		h.OpenTimeout = d.OpenTimeout
	}
	return h
}

// CheckModules checks that the kernel lists its modules (Proc/modules:
// without it cuFileDriverOpen never returns) and says whether nvidia_fs is
// among them: true, GDS mode is possible; false, cuFile runs in its
// compatibility mode.
func (h CuFileHost) CheckModules() (nvfs bool, err error) {
	h = h.withDefaults()
	p := filepath.Join(h.Proc, "modules")
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%w: no %s (a kernel without loadable modules): cuFile's driver open would hang on this kernel (libcufile reads it to find nvidia_fs); use gpu_path bounce, or run on a kernel with CONFIG_MODULES", ErrCuFilePrecondition, p)
	}
	if err != nil {
		return false, fmt.Errorf("%w: %s unreadable (libcufile reads it to find nvidia_fs): %w", ErrCuFilePrecondition, p, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, _, _ := strings.Cut(sc.Text(), " "); name == "nvidia_fs" {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("%w: reading %s: %w", ErrCuFilePrecondition, p, err)
	}
	return false, nil
}

// CheckDevice checks that udev has a record of block device dev (a
// filesystem's st_dev; name is how the error shows it, e.g. the dataset's
// root) with ID_FS_USAGE, without which cuFile refuses every handle on it.
func (h CuFileHost) CheckDevice(dev uint64, name string) error {
	h = h.withDefaults()
	maj, min := unix.Major(dev), unix.Minor(dev)
	p := filepath.Join(h.Udev, "data", fmt.Sprintf("b%d:%d", maj, min))
	how := fmt.Sprintf("start systemd-udevd (udevadm trigger --subsystem-match=block), or provide %s with the line E:ID_FS_USAGE=filesystem", p)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: no udev record for %s (block device b%d:%d): cuFile refuses its handles (5027, CU_FILE_HANDLE_NOT_REGISTERED: udev property not found: ID_FS_USAGE); %s", ErrCuFilePrecondition, name, maj, min, how)
	}
	if err != nil {
		return fmt.Errorf("%w: the udev record of %s (b%d:%d) unreadable: %w", ErrCuFilePrecondition, name, maj, min, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "E:ID_FS_USAGE="); ok && v != "" {
			return nil
		}
	}
	return fmt.Errorf("%w: the udev record %s of %s has no ID_FS_USAGE: cuFile refuses its handles (5027); %s", ErrCuFilePrecondition, p, name, how)
}
