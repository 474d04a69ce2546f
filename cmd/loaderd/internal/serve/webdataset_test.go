// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// wdsFS writes two tars of 12 samples each under the attack filesystem's
// "shards" (wdsTars), maps them as mkbmap --reader webdataset does, and
// returns the map and the members' bytes by "shard/name".
func wdsFS(t *testing.T, a *attackFS) (*wds.Map, map[string][]byte) {
	t.Helper()
	want := wdsTars(t, a)
	out := filepath.Join(t.TempDir(), "wds.bmap")
	if _, err := wds.Build(context.Background(), a.fs.Path("shards"), out, wds.BuildOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := wds.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	return m, want
}

// wdsTars writes two tars of 12 samples each under the attack
// filesystem's "shards" (each sample a .jpg, a .cls, every 5th without
// its .cls) and returns the members' bytes by "shard/name".
func wdsTars(t *testing.T, a *attackFS) map[string][]byte {
	t.Helper()
	want := map[string][]byte{}
	for s := range 2 {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for i := range 12 {
			key := fmt.Sprintf("s%d-%03d", s, i)
			files := [][2]string{{key + ".jpg", strings.Repeat(fmt.Sprintf("JPG-%d-%d|", s, i), 300+211*i)}}
			if i%5 != 4 {
				files = append(files, [2]string{key + ".cls", fmt.Sprint(i % 3)})
			}
			for _, f := range files {
				if err := tw.WriteHeader(&tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), Typeflag: tar.TypeReg}); err != nil {
					t.Fatal(err)
				}
				tw.Write([]byte(f[1]))
				want[fmt.Sprintf("%d/%s", s, f[0])] = []byte(f[1])
			}
		}
		tw.Close()
		a.fs.WriteFile(t, fmt.Sprintf("shards/part-%d.tar", s), buf.Bytes())
	}
	a.fs.Sync(t)
	return want
}

// wdsEpoch reads one epoch of a session of k outputs a sample and
// returns each output's bytes by "shard/key/k" (a failed sample's: nil)
// and the failures' messages.
func (s *attackSession) wdsEpoch(m *wds.Map, k int) (got map[string][]byte, failed []string) {
	t := s.c.t
	t.Helper()
	got = map[string][]byte{}
	var rel []int
	for {
		var nb wire.NextResponse
		if code, msg := s.c.call("POST", "/v1/sessions/"+s.id+"/next", wire.NextRequest{Release: rel}, &nb); code != http.StatusOK {
			t.Fatalf("next: %d %s", code, msg)
		}
		if nb.EndOfEpoch {
			return got, failed
		}
		rel = []int{nb.Slot}
		if len(nb.Offsets) != k*len(nb.Indices) || len(nb.Lengths) != len(nb.Offsets) || len(nb.Labels) != 0 {
			t.Fatalf("batch of %d samples: %d offsets, %d lengths, %d labels: want %d, %d, 0", len(nb.Indices), len(nb.Offsets), len(nb.Lengths), len(nb.Labels), k*len(nb.Indices), k*len(nb.Indices))
		}
		for i, idx := range nb.Indices {
			smp, err := m.Sample(int(idx))
			if err != nil {
				t.Fatal(err)
			}
			for o := range k {
				off, n := nb.Offsets[i*k+o], nb.Lengths[i*k+o]
				got[fmt.Sprintf("%d/%s/%d", smp.Shard, smp.Key, o)] = append([]byte(nil), s.mem[off:off+n]...)
			}
		}
		for j, pos := range nb.Failed {
			smp, _ := m.Sample(int(nb.Indices[pos]))
			for o := range k {
				got[fmt.Sprintf("%d/%s/%d", smp.Shard, smp.Key, o)] = nil
			}
			failed = append(failed, nb.Errors[j])
		}
	}
}

// TestWebDatasetServed: a webdataset map served by a real daemon to a
// client as nobody, with each built-in raw and filesystem backend: the
// open response says its components, each batch lists K (offset,
// length) pairs a sample and no labels, and every output is its tar
// member's bytes (an absent .cls an empty output).
func TestWebDatasetServed(t *testing.T) {
	a := newAttackFS(t)
	m, want := wdsFS(t, a)
	sock := daemonWith(t, Config{WebDatasets: map[string]*wds.Map{"ds": m}, SessionTimeout: time.Minute})
	c := connectAs(t, sock, nobodyWho)
	var ds wire.DatasetsResponse
	if code, msg := c.call("GET", "/v1/datasets", nil, &ds); code != http.StatusOK || len(ds.Datasets) != 1 || ds.Datasets[0].Reader != "webdataset" || *ds.Datasets[0].Samples != 24 {
		t.Fatalf("datasets: %d %s %+v", code, msg, ds)
	}
	for _, be := range []string{"file", "gds", "bam"} {
		t.Run(be, func(t *testing.T) {
			s, o, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: be, ReaderArgs: loader.ReaderArgs{BatchSize: 5, NumShards: 1, RandomShuffle: true, Seed: 3}},
				Ext: []string{"jpg", "cls"}})
			if code != http.StatusOK {
				t.Fatalf("open: %d %s", code, msg)
			}
			if o.Components != 2 || o.Reader != "webdataset" || !o.State.Sampling.WebDataset || o.State.Sampling.N != 24 {
				t.Fatalf("open response: components %d, reader %q, sampling %+v", o.Components, o.Reader, o.State.Sampling)
			}
			got, failed := s.wdsEpoch(m, 2)
			if len(failed) > 0 {
				t.Fatal(failed)
			}
			if len(got) != 48 {
				t.Fatalf("%d outputs, want 48", len(got))
			}
			for sh := range 2 {
				for i := range 12 {
					key := fmt.Sprintf("s%d-%03d", sh, i)
					for o, ext := range []string{"jpg", "cls"} {
						if g, w := got[fmt.Sprintf("%d/%s/%d", sh, key, o)], want[fmt.Sprintf("%d/%s.%s", sh, key, ext)]; !bytes.Equal(g, w) {
							t.Fatalf("%s.%s: %d bytes, want %d", key, ext, len(g), len(w))
						}
					}
				}
			}
		})
	}
}

// TestWebDatasetOpenArgs: the webdataset arguments are checked against
// the dataset: required for a webdataset, refused for a file dataset,
// missing_component_behavior error with an underfull sample refused
// naming its tar, an ext no member has refused, skip serving the full
// samples only and counting the others.
func TestWebDatasetOpenArgs(t *testing.T) {
	a := newAttackFS(t)
	m, _ := wdsFS(t, a)
	sock := daemonWith(t, Config{WebDatasets: map[string]*wds.Map{"ds": m}, Datasets: map[string]*bmap.Map{"files": a.build(t)}, SessionTimeout: time.Minute})
	c := connectAs(t, sock, nobodyWho)
	ra := loader.ReaderArgs{BatchSize: 4, NumShards: 1}
	for _, tc := range []struct {
		name string
		req  wire.OpenRequest
		code int
		msg  string
	}{
		{"no ext", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: ra}}, 400, "ext is required"},
		{"ext on files", wire.OpenRequest{Dataset: "files", Request: loader.Request{ReaderArgs: ra}, Ext: []string{"jpg"}}, 400, "for webdataset datasets"},
		{"bad missing", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: ra}, Ext: []string{"jpg"}, MissingComponentBehavior: "drop"}, 400, "missing_component_behavior"},
		{"long ext", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: ra}, Ext: []string{strings.Repeat("x", 300)}}, 400, "at most 256"},
		{"error underfull", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: ra}, Ext: []string{"jpg", "cls"}, MissingComponentBehavior: "error"}, 400, "part-0.tar"},
		{"unmatched ext", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: ra}, Ext: []string{"jpg", ".cls"}}, 400, `ext[1] ".cls" fills no output`},
		{"shuffle_after_epoch", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1, ShuffleAfterEpoch: true}}, Ext: []string{"jpg"}}, 400, "shuffle_after_epoch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o wire.OpenResponse
			code, msg := c.call("POST", "/v1/sessions", tc.req, &o)
			if code != tc.code || !strings.Contains(msg, tc.msg) {
				t.Fatalf("%d %q, want %d with %q", code, msg, tc.code, tc.msg)
			}
		})
	}
	s, o, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: ra}, Ext: []string{"jpg", "cls"}, MissingComponentBehavior: "skip"})
	if code != http.StatusOK || o.State.Sampling.N != 20 || o.Skipped != 4 || !slices.Equal(o.SkippedLacking, []int{0, 4}) {
		t.Fatalf("skip: %d %s, n %d, skipped %d %v (want 20, 4 [0 4])", code, msg, o.State.Sampling.N, o.Skipped, o.SkippedLacking)
	}
	s.c.call("DELETE", "/v1/sessions/"+s.id, nil, nil)
}

// TestAttackWebDatasetTar: access to a webdataset is checked as the
// caller on its tars: at the open, every tar (a 0600 tar: 403 naming
// it), and as they are read (a tar made 0600 while the session reads
// fails its samples, naming it, none of its bytes served); a tar
// rewritten in place after registration fails its members (never its
// new bytes) while the other tar's are served.
func TestAttackWebDatasetTar(t *testing.T) {
	a := newAttackFS(t)
	m, want := wdsFS(t, a)
	tar1 := a.fs.Path("shards/part-1.tar")
	sock := daemonWith(t, Config{WebDatasets: map[string]*wds.Map{"ds": m}, SessionTimeout: time.Minute})
	c := connectAs(t, sock, nobodyWho)
	req := wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: "gds", ReaderArgs: loader.ReaderArgs{BatchSize: 6, NumShards: 1}}, Ext: []string{"jpg", "cls"}}
	os.Chmod(tar1, 0o600)
	if _, _, code, msg := c.openReq(req); code != http.StatusForbidden || !strings.Contains(msg, "part-1.tar") {
		t.Fatalf("open with a 0600 tar: %d %s: want 403 naming it", code, msg)
	}
	os.Chmod(tar1, 0o644)
	for _, be := range []string{"gds", "file"} {
		req.Request.Backend = be
		s, _, code, msg := c.openReq(req)
		if code != http.StatusOK {
			t.Fatalf("%s: open: %d %s", be, code, msg)
		}
		os.Chmod(tar1, 0o600)
		s.wdsEpoch(m, 2) // batches read ahead before the chmod were readable then
		got, failed := s.wdsEpoch(m, 2)
		if len(failed) != 12 || !strings.Contains(failed[0], "part-1.tar") {
			t.Fatalf("%s: a 0600 tar: %d failed samples, want its 12, naming it: %v", be, len(failed), failed)
		}
		for k, v := range got {
			if strings.HasPrefix(k, "1/") && v != nil {
				t.Fatalf("%s: %s of the 0600 tar served to nobody", be, k)
			}
		}
		s.c.call("DELETE", "/v1/sessions/"+s.id, nil, nil)
		os.Chmod(tar1, 0o644)
	}
	for _, be := range []string{"gds", "file"} {
		req.Request.Backend = be
		s, _, code, msg := c.openReq(req)
		if code != http.StatusOK {
			t.Fatalf("%s: open: %d %s", be, code, msg)
		}
		defer s.c.call("DELETE", "/v1/sessions/"+s.id, nil, nil)
		if _, failed := s.wdsEpoch(m, 2); len(failed) > 0 {
			t.Fatalf("%s: before the rewrite: %v", be, failed)
		}
	}
	old, _ := os.ReadFile(tar1)
	f, err := os.OpenFile(tar1, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte("EVIL"), (len(old)-1024)/4), 512)
	f.Close()
	a.fs.Sync(t)
	time.Sleep(200 * time.Millisecond) // the watch sees it
	for _, be := range []string{"gds", "file"} {
		req.Request.Backend = be
		s, _, code, msg := c.openReq(req)
		if code != http.StatusOK {
			t.Fatalf("%s: open after the rewrite: %d %s", be, code, msg)
		}
		got, failed := s.wdsEpoch(m, 2)
		if len(failed) != 12 {
			t.Fatalf("%s: %d failed samples, want tar 1's 12: %v", be, len(failed), failed)
		}
		for k, v := range got {
			if bytes.Contains(v, []byte("EVIL")) {
				t.Fatalf("%s: %s: the rewritten tar's bytes served", be, k)
			}
			if strings.HasPrefix(k, "0/") && strings.HasSuffix(k, "/0") && v == nil { // a .jpg: never empty
				t.Fatalf("%s: %s of the untouched tar failed", be, k)
			}
		}
		if !bytes.Equal(got["0/s0-000/0"], want["0/s0-000.jpg"]) {
			t.Fatalf("%s: tar 0's first sample changed", be)
		}
		s.c.call("DELETE", "/v1/sessions/"+s.id, nil, nil)
	}
}

// TestAttackWebDatasetTarReplaced: a tar truncated after mapping (its
// members' ranges past its end), or replaced by a symlink or a hard link
// to a root-only file of the secret, fails its samples in nobody's
// sessions opened before (no 500, no byte past its end, no byte of the
// secret in the batch memory) while the other tar's are served, with
// each backend; a session opened after fails them too, or is a 403
// naming the tar where nobody may not read what it now is.
func TestAttackWebDatasetTarReplaced(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, a *attackFS, tar string)
	}{
		{"truncated", func(t *testing.T, a *attackFS, tar string) {
			if err := os.Truncate(tar, 1024); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink", func(t *testing.T, a *attackFS, tar string) {
			fi, _ := os.Stat(tar)
			sec := a.writeSecret(t, "vault/secret.tar", int(fi.Size()))
			os.Remove(tar)
			if err := os.Symlink(sec, tar); err != nil {
				t.Fatal(err)
			}
		}},
		{"hardlink", func(t *testing.T, a *attackFS, tar string) {
			fi, _ := os.Stat(tar)
			sec := a.writeSecret(t, "shards/.secret", int(fi.Size()))
			if err := os.Link(sec, tar+".new"); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tar+".new", tar); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAttackFS(t)
			m, want := wdsFS(t, a)
			sock := daemonWith(t, Config{WebDatasets: map[string]*wds.Map{"ds": m}, SessionTimeout: time.Minute})
			c := connectAs(t, sock, nobodyWho)
			var open []*attackSession
			for _, be := range []string{"gds", "file"} {
				req := wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: be, ReaderArgs: loader.ReaderArgs{BatchSize: 6, NumShards: 1}}, Ext: []string{"jpg", "cls"}}
				s, _, code, msg := c.openReq(req)
				if code != http.StatusOK {
					t.Fatalf("%s: open: %d %s", be, code, msg)
				}
				open = append(open, s)
			}
			tc.change(t, a, a.fs.Path("shards/part-1.tar"))
			a.fs.Sync(t)
			time.Sleep(200 * time.Millisecond) // the watch sees it
			// A new session: the tar is checked as nobody at the open
			// (a 403 naming it where nobody may not read what it is now).
			req := wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: "gds", ReaderArgs: loader.ReaderArgs{BatchSize: 6, NumShards: 1}}, Ext: []string{"jpg", "cls"}}
			if s, _, code, msg := c.openReq(req); code == http.StatusOK {
				open = append(open, s)
			} else if code != http.StatusForbidden || !strings.Contains(msg, "part-1.tar") {
				t.Errorf("a new open: %d %s: want 200, or 403 naming the tar", code, msg)
			}
			for _, s := range open {
				be := s.id
				s.wdsEpoch(m, 2) // batches read ahead before the change
				got, failed := s.wdsEpoch(m, 2)
				if len(failed) != 12 {
					t.Errorf("%s: %d failed samples, want tar 1's 12: %v", be, len(failed), failed)
				}
				if i := bytes.Index(s.mem, secret); i >= 0 {
					t.Errorf("%s: the secret is in the batch memory at %d", be, i)
				}
				for k, v := range got {
					if strings.HasPrefix(k, "1/") && v != nil {
						t.Errorf("%s: %s of the changed tar served (%d bytes)", be, k, len(v))
					}
				}
				if !bytes.Equal(got["0/s0-000/0"], want["0/s0-000.jpg"]) {
					t.Errorf("%s: tar 0's first sample not served", be)
				}
				s.c.call("DELETE", "/v1/sessions/"+s.id, nil, nil)
			}
		})
	}
}
