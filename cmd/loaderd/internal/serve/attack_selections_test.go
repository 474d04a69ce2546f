// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"archive/tar"
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// writeTar writes a tar of members (name, content) at rel under the
// attack filesystem, with mode.
func writeTar(t *testing.T, a *attackFS, rel string, mode os.FileMode, members ...string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range members {
		body := strings.Repeat(name+"|", 40)
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	a.fs.WriteFile(t, rel, buf.Bytes())
	if err := os.Chmod(a.fs.Path(rel), mode); err != nil {
		t.Fatal(err)
	}
}

// TestAttackSelectionsTellNothing: a webdataset of a public tar and a
// 0600 one, root's, holding an underfull sample "patient-SMITH-JOHN-1984"
// and three .dcm members. As nobody and a throwaway uid, an open whose
// selection would have to look into the 0600 tar (missing_component_
// behavior error, which names the first underfull sample; skip, whose
// sample count counts its members of any extension asked for; empty,
// whose count and slot size are its) is a 403 naming only the tar, as
// the caller may list it: no key, no count. A reader of every tar (the
// tar made 0644) gets the 400 naming the sample and the counts, as
// before. Before, nobody's error open was a 400 naming the patient, and
// skip with ext dcm opened with 3 samples. An ext no member has is
// refused naming the tars' extensions, to a reader of every tar only.
func TestAttackSelectionsTellNothing(t *testing.T) {
	a := newAttackFS(t)
	writeTar(t, a, "shards/a_secret.tar", 0o600, "patient-SMITH-JOHN-1984.jpg",
		"scan-1.dcm", "scan-1.jpg", "scan-1.cls", "scan-2.dcm", "scan-2.jpg", "scan-2.cls", "scan-3.dcm", "scan-3.jpg", "scan-3.cls")
	writeTar(t, a, "shards/part-0.tar", 0o644, "p-1.jpg", "p-1.cls", "p-2.jpg", "p-2.cls")
	a.fs.Sync(t)
	out := filepath.Join(t.TempDir(), "wds.bmap")
	buildWDSMap(t, a, out, nil)
	_, wm, err := session.LoadMap(out)
	if err != nil {
		t.Fatal(err)
	}
	sock := daemonWith(t, Config{WebDatasets: map[string]*wds.Map{"ds": wm}, SessionTimeout: time.Minute})
	req := func(missing string, ext ...string) wire.OpenRequest {
		return wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: "file", ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}},
			Ext: ext, MissingComponentBehavior: missing}
	}
	cases := []wire.OpenRequest{req("error", "jpg", "cls"), req("skip", "dcm"), req("skip", "jpg", "cls"), req("empty", "jpg"), req("empty", "png")}
	for _, w := range []who{nobodyWho, throwawayWho} {
		c := connectAs(t, sock, w)
		for _, r := range cases {
			var o wire.OpenResponse
			code, msg := c.call("POST", "/v1/sessions", r, &o)
			if code != http.StatusForbidden || strings.Contains(msg, "patient") || strings.Contains(msg, "SMITH") || strings.Contains(msg, "dcm") || !strings.Contains(msg, "shards/a_secret.tar") {
				t.Errorf("uid %d, %s %q: %d %q (%d samples): want 403 naming only the tar", w.uid, r.MissingComponentBehavior, r.Ext, code, msg, o.State.Sampling.N)
			}
		}
	}
	// A reader of every tar is told what it may read.
	if err := os.Chmod(a.fs.Path("shards/a_secret.tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := connectAs(t, sock, nobodyWho)
	var o wire.OpenResponse
	if code, msg := c.call("POST", "/v1/sessions", cases[0], &o); code != http.StatusBadRequest || !strings.Contains(msg, `"patient-SMITH-JOHN-1984"`) {
		t.Errorf("a reader, error: %d %q: want 400 naming the underfull sample", code, msg)
	}
	if code, msg := c.call("POST", "/v1/sessions", cases[4], &o); code != http.StatusBadRequest || !strings.Contains(msg, `"dcm"`) {
		t.Errorf("a reader, ext png: %d %q: want 400 naming the tars' extensions", code, msg)
	}
	for r, n := range map[int]int{1: 3, 2: 5, 3: 6} {
		s, o, code, msg := c.openReq(cases[r])
		if code != http.StatusOK || o.State.Sampling.N != n {
			t.Errorf("a reader, %s %q: %d %q, %d samples: want %d", cases[r].MissingComponentBehavior, cases[r].Ext, code, msg, o.State.Sampling.N, n)
			continue
		}
		s.c.call("DELETE", "/v1/sessions/"+s.id, nil, nil)
	}
}
