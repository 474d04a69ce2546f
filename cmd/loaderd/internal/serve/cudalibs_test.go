// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// TestAttackGPUOpenHidesTheSearch: a daemon whose CUDA search finds no
// usable library (--cuda-lib-dir naming a folder that is another user's
// symlink in a sticky world-writable one, a CUDA_HOME missing under it)
// refuses GPU opens with 400 and a message that names no place of its
// search, to nobody and to a throwaway uid alike; it discovers once,
// however many GPU opens come, and logs every place and reason once.
func TestAttackGPUOpenHidesTheSearch(t *testing.T) {
	a := newAttackFS(t)
	m := a.build(t)
	tmp := filepath.Join(a.fs.Dir, "sticky")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, os.ModeSticky|0o777)
	lib := filepath.Join(tmp, "cuda-lib-dir")
	if err := os.Symlink("/usr/lib", lib); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(lib, nobodyID, nobodyID); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(tmp, "x", "missing")
	env := map[string]string{cuda.EnvLibDir: lib, "CUDA_HOME": home}
	var logs testenv.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	libs := cuda.NewLibs(cuda.Search{Getenv: func(k string) string { return env[k] }, NoLoaderSearch: true}, log)
	sock := daemonWith(t, Config{Datasets: map[string]*bmap.Map{"ds": m}, SessionTimeout: time.Minute, Logger: log, CUDA: libs})

	const opens = 12
	for i := range opens {
		w := nobodyWho
		if i%2 == 1 {
			w = who{43117, 43117, nil}
		}
		c := connectAs(t, sock, w)
		for _, gpuPath := range []string{"", loader.GPUPathBounce, loader.GPUPathCuFile} {
			code, msg := c.call("POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{Memory: batchmem.GPU, GPUPath: gpuPath, ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}}, nil)
			if code != http.StatusBadRequest {
				t.Fatalf("GPU open (gpu_path %q) as uid %d: %d %s, want 400", gpuPath, w.uid, code, msg)
			}
			for _, p := range []string{tmp, lib, home, "/usr/lib", "/usr/local", "lib64", cuda.EnvLibDir, "CUDA_HOME"} {
				if strings.Contains(msg, p) {
					t.Fatalf("GPU open (gpu_path %q) as uid %d: %q names %q, a place of the daemon's search", gpuPath, w.uid, msg, p)
				}
			}
			if i == 0 {
				t.Logf("gpu_path %q: %d %s", gpuPath, code, msg)
			}
			if !strings.Contains(msg, "no usable CUDA libraries") {
				t.Errorf("GPU open (gpu_path %q): %q, want it to say the daemon has no usable CUDA libraries", gpuPath, msg)
			}
		}
	}
	if n := libs.Searches(); n != 1 {
		t.Errorf("%d GPU opens ran %d discoveries, want 1", 3*opens, n)
	}
	out := logs.String()
	if n := strings.Count(out, "no usable libcudart"); n != 1 || !strings.Contains(out, lib) || !strings.Contains(out, home) {
		t.Errorf("the log says %d times that no libcudart is usable, want once naming %s and %s:\n%s", n, lib, home, out)
	}
}
