// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// swapperC is the attacker's program: in a tight loop it points its own
// symlink DIR/libcudart.so.13 at the good library and at its own, in
// turn, each swap atomic (a new symlink renamed over the old one).
const swapperC = `#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
	char tmp[4096], link[4096];
	snprintf(tmp, sizeof tmp, "%s/.swap", argv[1]);
	snprintf(link, sizeof link, "%s/libcudart.so.13", argv[1]);
	for (unsigned long i = 0;; i++) {
		unlink(tmp);
		if (symlink(argv[2 + (i & 1)], tmp) != 0 || rename(tmp, link) != 0) return 1;
	}
}
`

// TestDiscoveryRaceSwappedSymlink: a throwaway uid owns a symlink in a
// root-owned sticky world-writable folder (what --cuda-lib-dir or a
// CUDA_HOME under /tmp can name) and swaps it in a tight loop between
// root's good library and its own, whose constructor writes a marker
// file; discovery and load run over and over, a fresh folder for each
// load (a library once loaded stays loaded). The evil constructor must
// never run: it would run as root inside the daemon.
func TestDiscoveryRaceSwappedSymlink(t *testing.T) {
	requireRoot(t)
	root := openTree(t)
	marker := filepath.Join(root, "marker")
	good := filepath.Join(root, "good", "libgood.so")
	evil := filepath.Join(root, "evil", "libevil.so")
	mkdir(t, filepath.Dir(good), 0o755, 0, 0)
	mkdir(t, filepath.Dir(evil), 0o755, 0, 0)
	buildSO(t, good, "int nvfeed_race(void) { return 1; }\n")
	buildSO(t, evil, fmt.Sprintf(`#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
	int fd = open(%q, O_WRONLY | O_CREAT, 0644);
	if (fd >= 0) close(fd);
}
int nvfeed_race(void) { return 2; }
`, marker))
	chown(t, filepath.Dir(evil), throwawayUID, throwawayUID)
	chown(t, evil, throwawayUID, throwawayUID)
	swapper := filepath.Join(root, "swapper")
	buildSwapper(t, swapper)

	const dirs, triesPerDir = 40, 25
	loads, refusals := 0, 0
	for i := range dirs {
		d := filepath.Join(root, "tmp", fmt.Sprintf("d%03d", i))
		mkdir(t, d, os.ModeSticky|0o777, 0, 0)
		stop := startSwapper(t, swapper, d, good, evil)
		s := Search{Getenv: func(k string) string { return map[string]string{EnvLibDir: d}[k] }, NoLoaderSearch: true}
		for range triesPerDir {
			_, _, err := s.open(Lib{Name: "libcudart", Files: []string{"libcudart.so.13"}})
			if err != nil {
				refusals++
				continue
			}
			loads++
			break // loaded: this folder's name is now the loader's
		}
		stop()
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("after %d discoveries (%d loads, %d refusals) in %d folders, the attacker's library constructor ran as root", loads+refusals, loads, refusals, i+1)
		}
	}
	t.Logf("%d discoveries: %d loads of root's library, %d refusals; the attacker's never loaded", loads+refusals, loads, refusals)
}

// buildSwapper compiles swapperC to path, runnable by anyone.
func buildSwapper(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path+".c", []byte(swapperC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cc", "-O2", "-o", path, path+".c").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	chmod(t, path, 0o755)
}

// startSwapper runs the swapper as the throwaway uid over dir and waits
// for its symlink to exist; stop kills it.
func startSwapper(t *testing.T, swapper, dir, good, evil string) (stop func()) {
	t.Helper()
	cmd := exec.Command(swapper, dir, good, evil)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: throwawayUID, Gid: throwawayUID}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Lstat(filepath.Join(dir, "libcudart.so.13")); err == nil {
			return stop
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("the swapper never made its symlink in %s", dir)
		}
	}
}
