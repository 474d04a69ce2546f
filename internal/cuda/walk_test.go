// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// The attacker's uids in these tests: nobody and a throwaway uid that no
// user database names.
const (
	nobodyUID    = 65534
	throwawayUID = 43117
)

// requireRoot skips (or under NVFEED_REQUIRE_PRIVILEGED=1 fails) a test
// that gives files to other users.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "cuda: giving files and symlinks to other users needs root (euid %d)", os.Geteuid())
	}
}

// openTree is a temporary directory that other users may reach: its
// parents (t.TempDir's are 0700) are opened to 0755.
func openTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for d := root; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		chmod(t, d, 0o755)
	}
	return root
}

// mkdir makes dir with exactly mode (umask aside), owned by uid:gid.
func mkdir(t *testing.T, dir string, mode os.FileMode, uid, gid int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	chown(t, dir, uid, gid)
	chmod(t, dir, mode)
}

// symlinkAs makes a symlink at link to target owned by uid.
func symlinkAs(t *testing.T, target, link string, uid int) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// buildSO compiles C source into a shared library at path with the system
// C compiler.
func buildSO(t *testing.T, path, src string) {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		testenv.SkipPrivileged(t, "cuda: no C compiler: %v", err)
	}
	c := path + ".c"
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", path, c).CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", c, err, out)
	}
	chmod(t, path, 0o755)
}

// TestDiscoveryWalksEveryComponent: every entry on the way to a library —
// each directory, each symlink (followed hop by hop), the file — must be
// root's (or the daemon's own user's), in a directory that no one else
// may write, or that is sticky (no one else may rename or remove what
// they do not own). A name missing from a directory that others may
// write is refused too: anyone could make it. A refused place is passed
// over, named in the next candidate's Refused with why.
func TestDiscoveryWalksEveryComponent(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name string
		// setup builds the case under root and returns the directory
		// searched first (NVFEED_CUDA_LIB_DIR, or CUDA_HOME when home).
		setup  func(t *testing.T, root, good string) (dir string)
		home   bool
		refuse string // what the refusal says; "" accepted
	}{
		{name: "symlink of nobody's in a root 1777 directory", setup: func(t *testing.T, root, good string) string {
			d := filepath.Join(root, "tmp")
			mkdir(t, d, os.ModeSticky|0o777, 0, 0)
			symlinkAs(t, good, filepath.Join(d, "libcudart.so.13"), nobodyUID)
			return d
		}, refuse: "owned by uid 65534"},
		{name: "root's symlink in a root 1777 directory", setup: func(t *testing.T, root, good string) string {
			d := filepath.Join(root, "tmp")
			mkdir(t, d, os.ModeSticky|0o777, 0, 0)
			symlinkAs(t, good, filepath.Join(d, "libcudart.so.13"), 0)
			return d
		}},
		{name: "directory group-writable by another group", setup: func(t *testing.T, root, good string) string {
			d := filepath.Join(root, "gw")
			mkdir(t, d, 0o775, 0, nobodyUID)
			symlinkAs(t, good, filepath.Join(d, "libcudart.so.13"), 0)
			return d
		}, refuse: "writable by group 65534"},
		{name: "directory group-writable by gid 0", setup: func(t *testing.T, root, good string) string {
			d := filepath.Join(root, "gw0")
			mkdir(t, d, 0o775, 0, 0)
			symlinkAs(t, good, filepath.Join(d, "libcudart.so.13"), 0)
			return d
		}},
		{name: "missing name under a sticky directory (CUDA_HOME)", home: true, setup: func(t *testing.T, root, good string) string {
			d := filepath.Join(root, "tmp")
			mkdir(t, d, os.ModeSticky|0o777, 0, 0)
			return filepath.Join(d, "x", "missing")
		}, refuse: "missing"},
		{name: "missing name under a root 0755 directory is just absent", home: true, setup: func(t *testing.T, root, good string) string {
			return filepath.Join(root, "absent", "missing")
		}, refuse: "-"},
		{name: "a chain of root's symlinks", setup: func(t *testing.T, root, good string) string {
			a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
			mkdir(t, a, 0o755, 0, 0)
			mkdir(t, b, 0o755, 0, 0)
			symlinkAs(t, good, filepath.Join(b, "hop2"), 0)
			symlinkAs(t, "../b/hop2", filepath.Join(b, "hop1"), 0)
			symlinkAs(t, filepath.Join(b, "hop1"), filepath.Join(a, "libcudart.so.13"), 0)
			return a
		}},
		{name: "a chain with a hop of nobody's", setup: func(t *testing.T, root, good string) string {
			a, s := filepath.Join(root, "a"), filepath.Join(root, "tmp")
			mkdir(t, a, 0o755, 0, 0)
			mkdir(t, s, os.ModeSticky|0o777, 0, 0)
			symlinkAs(t, good, filepath.Join(s, "hop"), nobodyUID)
			symlinkAs(t, filepath.Join(s, "hop"), filepath.Join(a, "libcudart.so.13"), 0)
			return a
		}, refuse: "owned by uid 65534"},
		{name: "a chain with a hop in a world-writable directory", setup: func(t *testing.T, root, good string) string {
			a, w := filepath.Join(root, "a"), filepath.Join(root, "open")
			mkdir(t, a, 0o755, 0, 0)
			mkdir(t, w, 0o777, 0, 0)
			symlinkAs(t, good, filepath.Join(w, "hop"), 0)
			symlinkAs(t, filepath.Join(w, "hop"), filepath.Join(a, "libcudart.so.13"), 0)
			return a
		}, refuse: "writable by others"},
		{name: "a directory on the way that is nobody's symlink", setup: func(t *testing.T, root, good string) string {
			s := filepath.Join(root, "tmp")
			mkdir(t, s, os.ModeSticky|0o777, 0, 0)
			symlinkAs(t, filepath.Dir(good), filepath.Join(s, "lib"), nobodyUID)
			return filepath.Join(s, "lib")
		}, refuse: "owned by uid 65534"},
		{name: "a symlink loop", setup: func(t *testing.T, root, good string) string {
			a := filepath.Join(root, "a")
			mkdir(t, a, 0o755, 0, 0)
			symlinkAs(t, "loop2", filepath.Join(a, "loop1"), 0)
			symlinkAs(t, "loop1", filepath.Join(a, "loop2"), 0)
			symlinkAs(t, "loop1", filepath.Join(a, "libcudart.so.13"), 0)
			return a
		}, refuse: "symlinks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := openTree(t)
			good := filepath.Join(root, "good", "libcudart.so.13")
			touch(t, root, "good/libcudart.so.13", "fallback/lib64/libcudart.so.13")
			dir := tc.setup(t, root, good)
			lib := filepath.Join(dir, "libcudart.so.13")
			env := map[string]string{EnvLibDir: dir, "CUDA_HOME": filepath.Join(root, "fallback")}
			if tc.home { // the home alone: its refusal is in the error
				env = map[string]string{"CUDA_HOME": dir}
			}
			s := Search{Getenv: func(k string) string { return env[k] }, NoLoaderSearch: true}
			c := s.Candidates(Cudart())
			if tc.home {
				_, _, err := s.open(Cudart())
				switch {
				case tc.refuse == "-" && err != nil && strings.Contains(err.Error(), "refused"):
					t.Errorf("an absent name under root's directories is refused: %v", err)
				case tc.refuse != "-" && (err == nil || !strings.Contains(err.Error(), tc.refuse) || !strings.Contains(err.Error(), "refused")):
					t.Errorf("CUDA_HOME=%s: %v, want a refusal saying %q: anyone may make that name", dir, err, tc.refuse)
				}
				return
			}
			if len(c) == 0 {
				t.Fatalf("no candidate at all")
			}
			if tc.refuse == "" {
				if c[0].Path != lib {
					t.Errorf("first candidate %s (refused %q), want %s", c[0], c[0].Refused, lib)
				}
				return
			}
			if c[0].Path == lib {
				t.Fatalf("%s is a candidate: something another user can change would be loaded by root", lib)
			}
			if len(c[0].Refused) != 1 || !strings.Contains(c[0].Refused[0], tc.refuse) || !strings.Contains(c[0].Refused[0], lib) {
				t.Errorf("the candidate after it (%s) says it passed over %q, want %s named with %q", c[0], c[0].Refused, lib, tc.refuse)
			}
		})
	}
}

// TestDiscoveryLoadsTheCheckedInode: the library loaded is the very file
// the walk checked — /proc/self/maps shows its device and inode mapped —
// and one that needs a library of its own directory by soname (DT_NEEDED,
// found through $ORIGIN: the CUDA stand-in's libcudart links its
// libcuda.so.1 so) still loads, its dependency from that directory too.
func TestDiscoveryLoadsTheCheckedInode(t *testing.T) {
	root := t.TempDir()
	dep := filepath.Join(root, "lib", "libnvfeeddep.so.1")
	if err := os.MkdirAll(filepath.Dir(dep), 0o755); err != nil {
		t.Fatal(err)
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		testenv.SkipPrivileged(t, "cuda: no C compiler: %v", err)
	}
	if err := os.WriteFile(dep+".c", []byte("int nvfeed_dep(void) { return 42; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-Wl,-soname,libnvfeeddep.so.1", "-o", dep, dep+".c").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	lib := filepath.Join(root, "lib", "libcudart.so.13")
	src := "int nvfeed_dep(void);\nint nvfeed_probe(void) { return nvfeed_dep(); }\n"
	if err := os.WriteFile(lib+".c", []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-Wl,-soname,libcudart.so.13", "-Wl,-rpath,$ORIGIN", "-Wl,--no-as-needed",
		"-o", lib, lib+".c", dep).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	// Reached through a root symlink, as an NVIDIA wheel's directory often is.
	link := filepath.Join(root, "via")
	if err := os.Symlink(filepath.Join(root, "lib"), link); err != nil {
		t.Fatal(err)
	}
	s := Search{Getenv: func(k string) string { return map[string]string{EnvLibDir: link}[k] }, NoLoaderSearch: true}
	h, found, err := s.open(Lib{Name: "libcudart", Files: []string{"libcudart.so.13"}})
	if err != nil {
		t.Fatal(err)
	}
	var st, dst unix.Stat_t
	if err := unix.Stat(lib, &st); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(dep, &dst); err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		what string
		st   unix.Stat_t
	}{{"the library", st}, {"its dependency", dst}} {
		if !mapsInode(string(maps), want.st) {
			t.Errorf("%s (dev %d:%d ino %d) is not mapped", want.what, unix.Major(want.st.Dev), unix.Minor(want.st.Dev), want.st.Ino)
		}
	}
	if found.Path != filepath.Join(link, "libcudart.so.13") || found.File() == "" {
		t.Errorf("found %+v", found)
	}
	sym, err := purego.Dlsym(h, "nvfeed_probe")
	if err != nil || sym == 0 {
		t.Fatalf("nvfeed_probe: %v", err)
	}
}

// mapsInode says whether a /proc/self/maps text maps the file st
// describes (its dev major:minor in hex, its inode).
func mapsInode(maps string, st unix.Stat_t) bool {
	for _, line := range strings.Split(maps, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		var maj, min uint32
		if _, err := fmt.Sscanf(f[3], "%x:%x", &maj, &min); err != nil {
			continue
		}
		if maj == unix.Major(st.Dev) && min == unix.Minor(st.Dev) && f[4] == strconv.FormatUint(st.Ino, 10) {
			return true
		}
	}
	return false
}

// BenchmarkDiscoveryCandidates: one discovery of libcudart over the
// process's places, the explicit directory a real library's (NVIDIA's
// wheel): what the daemon now pays once at start, and paid before on
// every GPU open.
func BenchmarkDiscoveryCandidates(b *testing.B) {
	wheels, err := filepath.Abs("../../.venv")
	if err != nil {
		b.Fatal(err)
	}
	m, _ := filepath.Glob(filepath.Join(wheels, "lib/python3*/site-packages/nvidia/cu13/lib"))
	if len(m) == 0 {
		b.Skip("no NVIDIA wheels in .venv")
	}
	s := SearchFromEnv()
	s.Getenv = func(k string) string { return map[string]string{EnvLibDir: m[0]}[k] }
	for b.Loop() {
		if c := s.Candidates(Cudart()); len(c) == 0 {
			b.Fatal("no candidate")
		}
	}
}
