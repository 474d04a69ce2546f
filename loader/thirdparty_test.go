// SPDX-License-Identifier: Apache-2.0

package loader_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// TestThirdPartyBackendReadsAsTheCaller builds testdata/thirdparty, a
// module of its own (its go.mod replaces nvfeed with this tree) whose
// backend uses only the public packages: it registers, and reads as the
// caller it is given. A file only its owner may read (0600, uid 43117)
// reads for that owner and fails for another uid (43118) with the
// kernel's "permission denied", though the process is root; a file anyone
// may read reads for both.
func TestThirdPartyBackendReadsAsTheCaller(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "reading as another user needs root")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.SkipPrivileged(t, "no go command to build the outside module: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "thirdparty")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	build.Dir = filepath.Join("testdata", "thirdparty")
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the outside module: %v\n%s", err, out)
	}
	root := t.TempDir()
	for _, p := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	const owner, other = 43117, 43118
	files := map[string]os.FileMode{"a/mine.jpg": 0o600, "a/open.jpg": 0o644}
	for name, mode := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("bytes of "+name), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, owner, owner); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		uid  int
		want []string
	}{
		{owner, []string{`a/mine.jpg ok "bytes of a/mine.jpg"`, `a/open.jpg ok "bytes of a/open.jpg"`}},
		{other, []string{"a/mine.jpg error: sample 0 (a/mine.jpg): open as uid 43118 gid 43118 groups []: permission denied", `a/open.jpg ok "bytes of a/open.jpg"`}},
	} {
		out, err := exec.Command(bin, "-root", root, "-uid", strconv.Itoa(tc.uid), "-gid", strconv.Itoa(tc.uid)).CombinedOutput()
		if err != nil {
			t.Fatalf("uid %d: %v\n%s", tc.uid, err, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w+"\n") {
				t.Errorf("uid %d: the output lacks %q:\n%s", tc.uid, w, out)
			}
		}
	}
}
