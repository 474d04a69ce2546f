// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// buildWDSMap maps the attack filesystem's shards (paths: those tars
// only; nil: all) into a map file at out, as mkbmap --reader webdataset
// does, and returns a reference copy of it decoded from its bytes (the
// test's own, apart from anything the daemon loads).
func buildWDSMap(t *testing.T, a *attackFS, out string, paths []string) *wds.Map {
	t.Helper()
	if _, err := wds.Build(context.Background(), a.fs.Path("shards"), out, wds.BuildOptions{Paths: paths}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := wds.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// servesAll reads an epoch of s (ext jpg, cls) and fails the test unless
// it holds exactly the n samples of ref, each output its member's bytes
// (want, by "shard/name"; an absent .cls an empty output).
func (s *attackSession) servesAll(what string, ref *wds.Map, want map[string][]byte, n int) {
	t := s.c.t
	t.Helper()
	got, failed := s.wdsEpoch(ref, 2)
	if len(failed) > 0 || len(got) != 2*n {
		t.Fatalf("%s: %d outputs, %d failed (%v): want %d outputs", what, len(got), len(failed), failed, 2*n)
	}
	for i := range ref.Len() {
		smp, _ := ref.Sample(i)
		for o, ext := range []string{"jpg", "cls"} {
			g := got[fmt.Sprintf("%d/%s/%d", smp.Shard, smp.Key, o)]
			if w := want[fmt.Sprintf("%d/%s.%s", smp.Shard, smp.Key, ext)]; !bytes.Equal(g, w) {
				t.Fatalf("%s: %s.%s: %d bytes, want its %d", what, smp.Key, ext, len(g), len(w))
			}
		}
	}
}

// TestAttackMapWriter: a throwaway uid ran mkbmap (the map file is its
// own, in its home); root registered the map. While sessions of nobody
// (file) and of the map's writer (gds) read, the writer rewrites the map
// in place with random bytes, then truncates it to nothing, and root
// cp's a smaller map (one tar of two) over it: every open session and
// every new one keeps serving the map the daemon loaded, byte-exact, its
// 24 samples. A reload swaps to the cp'ed map (12 samples for new
// sessions, the open ones keep their 24); a map truncated to 100 bytes
// is then refused by the next reload, the dataset keeping its map.
// Before, the map was the file's shared mapping, read at every access:
// the rewrite made next answer 500, the truncation killed the daemon
// with SIGBUS (every user's sessions gone).
func TestAttackMapWriter(t *testing.T) {
	a := newAttackFS(t)
	want := wdsTars(t, a)
	home := a.fs.Path(fmt.Sprintf("home%d", throwawayUID))
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(home, throwawayUID, throwawayUID)
	mapPath := filepath.Join(home, "wds.bmap")
	ref := buildWDSMap(t, a, mapPath, nil)
	if err := os.Chown(mapPath, throwawayUID, throwawayUID); err != nil {
		t.Fatal(err)
	}
	small := filepath.Join(t.TempDir(), "small.bmap")
	smallRef := buildWDSMap(t, a, small, []string{"part-0.tar"})
	_, wm, err := session.LoadMap(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	sock := daemonWith(t, Config{WebDatasets: map[string]*wds.Map{"ds": wm}, SessionTimeout: time.Minute,
		MapFiles: func() (map[string]string, error) { return map[string]string{"ds": mapPath}, nil }})
	nobody, writer := connectAs(t, sock, nobodyWho), connectAs(t, sock, throwawayWho)
	open := func(c *peerClient, be string, n int) *attackSession {
		t.Helper()
		s, o, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: be, ReaderArgs: loader.ReaderArgs{BatchSize: 5, NumShards: 1}},
			Ext: []string{"jpg", "cls"}})
		if code != http.StatusOK || o.State.Sampling.N != n {
			t.Fatalf("open as uid %d: %d %s, %d samples (want %d)", c.w.uid, code, msg, o.State.Sampling.N, n)
		}
		return s
	}
	s1, s2 := open(nobody, "file", 24), open(writer, "gds", 24)
	s1.servesAll("before", ref, want, 24)
	s2.servesAll("before", ref, want, 24)
	fi, _ := os.Stat(mapPath)
	for _, attack := range []struct{ name, script string }{
		{"rewritten in place", fmt.Sprintf("dd if=/dev/urandom of=%s bs=%d count=1 conv=notrunc status=none", mapPath, fi.Size())},
		{"truncated", "truncate -s 0 " + mapPath},
	} {
		shellAs(t, throwawayUID, attack.script)
		s1.servesAll(attack.name, ref, want, 24)
		s2.servesAll(attack.name, ref, want, 24)
		open(nobody, "gds", 24).servesAll(attack.name+", a new session", ref, want, 24)
	}
	if out, err := exec.Command("cp", small, mapPath).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	s1.servesAll("cp'ed over", ref, want, 24)
	open(writer, "file", 24).servesAll("cp'ed over, a new session", ref, want, 24)

	reload := func(outcome string, samples int) {
		t.Helper()
		res, err := RequestReload(context.Background(), sock)
		if err != nil || len(res.Datasets) != 1 || res.Datasets[0].Outcome != outcome || res.Datasets[0].Samples != samples {
			t.Fatalf("reload: %+v %v: want %s, %d samples", res, err, outcome, samples)
		}
	}
	reload(session.ReloadReplaced, 12)
	open(nobody, "gds", 12).servesAll("reloaded", smallRef, want, 12)
	s1.servesAll("an open session after the reload", ref, want, 24)
	s2.servesAll("an open session after the reload", ref, want, 24)
	shellAs(t, throwawayUID, "truncate -s 100 "+mapPath)
	reload(session.ReloadFailed, 12)
	open(writer, "file", 12).servesAll("a bad map refused", smallRef, want, 12)
}
