// SPDX-License-Identifier: Apache-2.0

package serve

import (
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
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// The attacker's tests of what lazy access and files= tell about samples
// the caller may not read (docs/security.md, promises 1 and 10).

// TestAttackFilesNamesNoUnlistedFile: an open with files= tells a caller
// whether a name is a sample of the map only where the caller could have
// found that out itself. A name under a folder it may not search is a 403
// whether or not the map holds it (before, a name the map lacked was a
// 400 "is not a sample" and one it held a 403: an oracle for the file
// names in a 0700 folder, and in a 0700 root). As nobody and a throwaway
// uid.
func TestAttackFilesNamesNoUnlistedFile(t *testing.T) {
	a := newAttackFS(t)
	a.fs.WriteFile(t, "data/hidden/plan-2031.jpg", []byte("public bytes, private name"))
	os.Chmod(filepath.Join(a.root, "hidden"), 0o700)
	m := a.build(t)
	sock := daemon(t, m)
	open := func(c *peerClient, names ...string) (int, string) {
		_, _, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds", Files: names,
			Request: loader.Request{Backend: "file", ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}})
		return code, msg
	}
	for _, w := range []who{nobodyWho, {43117, 43117, nil}} {
		c := connectAs(t, sock, w)
		name := fmt.Sprintf("uid %d", w.uid)
		// What the caller may find out itself: a missing name in a folder
		// it may search is "not a sample".
		if code, msg := open(c, "c0/nope.jpg"); code != http.StatusBadRequest || !strings.Contains(msg, "not a sample") {
			t.Errorf("%s: a missing name in a readable folder: %d %q, want 400 not a sample", name, code, msg)
		}
		// A name outside the root: never opened, never a sample.
		if code, msg := open(c, "../vault/public.jpg"); code != http.StatusBadRequest || !strings.Contains(msg, "not a sample") {
			t.Errorf("%s: a name outside the root: %d %q, want 400", name, code, msg)
		}
		// In the 0700 folder, mapped or not: the same 403, naming no file.
		mapped, mcode := "", 0
		for _, n := range []string{"hidden/plan-2031.jpg", "hidden/plan-2032.jpg", "hidden/x/../plan-2031.jpg"} {
			code, msg := open(c, n)
			if code != http.StatusForbidden {
				t.Errorf("%s: files=%q in a 0700 folder: %d %q, want 403 whether or not mapped", name, n, code, msg)
			}
			if strings.Contains(msg, "plan-") {
				t.Errorf("%s: files=%q: the refusal names the file: %q", name, n, msg)
			}
			if mcode == 0 {
				mapped, mcode = msg, code
			} else if code != mcode {
				t.Errorf("%s: mapped %d %q, unmapped %d %q: the answers differ", name, mcode, mapped, code, msg)
			}
		}
		// A mapped readable file with an unmapped one in the 0700 folder:
		// still the 403 (the unmapped name is not told apart).
		if code, msg := open(c, "c0/000.jpg", "hidden/plan-2032.jpg"); code != http.StatusForbidden {
			t.Errorf("%s: a readable name and an unmapped one in a 0700 folder: %d %q, want 403", name, code, msg)
		}
	}
	// The root itself 0700: every name is a 403.
	os.Chmod(a.root, 0o700)
	c := connectAs(t, sock, nobodyWho)
	for _, n := range []string{"c0/000.jpg", "c0/nope.jpg", "nope.jpg"} {
		if code, msg := open(c, n); code != http.StatusForbidden {
			t.Errorf("0700 root: files=%q: %d %q, want 403", n, code, msg)
		}
	}
}

// TestAttackRefusedSampleTellsNothing: a numpy sample the caller may not
// open fails in the batch stream with no shape (its header's content) and
// no label of its own: its shape is [0] (its length), its label 0.
// Before, a 0600 sample's shape [7 13] came with every batch holding it.
func TestAttackRefusedSampleTellsNothing(t *testing.T) {
	a := newAttackFS(t)
	write := func(rel string, shape []int64, mode os.FileMode) {
		h, err := npy.Encode(npy.Header{DType: npy.Uint8, Shape: shape})
		if err != nil {
			t.Fatal(err)
		}
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		a.fs.WriteFile(t, rel, append(h, make([]byte, n)...))
		os.Chmod(a.fs.Path(rel), mode)
	}
	root := a.fs.Path("np")
	write("np/a.npy", []int64{3, 5}, 0o644)
	write("np/b.npy", []int64{7, 13}, 0o600)
	write("np/c.npy", []int64{2, 9}, 0o644)
	write("np/d.npy", []int64{4}, 0o644)
	a.fs.Sync(t)
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{Reader: bmap.ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	sock := daemon(t, m)
	for _, be := range []string{"file", "gds"} {
		for _, w := range []who{nobodyWho, {43118, 43118, nil}} {
			c := connectAs(t, sock, w)
			s, _, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds",
				Request: loader.Request{Backend: be, ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}})
			if code != http.StatusOK {
				t.Fatalf("%s: open as uid %d: %d %s", be, w.uid, code, msg)
			}
			var nb wire.NextResponse
			if code, msg := c.call("POST", "/v1/sessions/"+s.id+"/next", nil, &nb); code != http.StatusOK {
				t.Fatalf("%s: next: %d %s", be, code, msg)
			}
			if len(nb.Failed) != 1 {
				t.Fatalf("%s: uid %d: failed %v, want b.npy alone", be, w.uid, nb.Failed)
			}
			pos := nb.Failed[0]
			if got := nb.Shapes[pos]; !slices.Equal(got, []int64{0}) {
				t.Errorf("%s: uid %d: the refused sample's shape is %v (its header's), want [0]", be, w.uid, got)
			}
			if nb.Lengths[pos] != 0 || nb.Labels[pos] != 0 {
				t.Errorf("%s: uid %d: the refused sample's length %d label %d, want 0 and 0", be, w.uid, nb.Lengths[pos], nb.Labels[pos])
			}
		}
	}
}

// TestAttackRefusedSampleSizeHidden: the layout of a batch with a sample
// the caller may not open tells nothing of that sample's size. Two
// daemons serve maps that differ only in the refused sample's size (a
// few bytes, or 40 KiB; a numpy array of the others' shape, or another);
// a batch holding it must come with the same offsets, lengths and
// labels from both. Before, its room was sized from the map before the
// access check: the next sample's offset told its size to 4 KiB, and a
// numpy batch went ragged where the refused array's size differed. As
// nobody and a throwaway uid.
func TestAttackRefusedSampleSizeHidden(t *testing.T) {
	type layout struct {
		offsets, lengths []int64
		labels           []int32
		failed           []int
	}
	jpg := func(secretSize int) func(t *testing.T, a *attackFS) *bmap.Map {
		return func(t *testing.T, a *attackFS) *bmap.Map {
			os.Remove(a.fs.Path("data/c0/001.jpg"))
			a.writeSecret(t, "data/c0/001.jpg", secretSize)
			return a.build(t)
		}
	}
	numpy := func(shape []int64) func(t *testing.T, a *attackFS) *bmap.Map {
		return func(t *testing.T, a *attackFS) *bmap.Map {
			write := func(rel string, shape []int64, mode os.FileMode) {
				h, err := npy.Encode(npy.Header{DType: npy.Uint8, Shape: shape})
				if err != nil {
					t.Fatal(err)
				}
				n := int64(1)
				for _, d := range shape {
					n *= d
				}
				a.fs.WriteFile(t, rel, append(h, make([]byte, n)...))
				os.Chmod(a.fs.Path(rel), mode)
			}
			write("np/a.npy", []int64{30, 50}, 0o644)
			write("np/b.npy", shape, 0o600)
			write("np/c.npy", []int64{30, 50}, 0o644)
			write("np/d.npy", []int64{30, 50}, 0o644)
			a.fs.Sync(t)
			m, err := bmap.Build(context.Background(), a.fs.Path("np"), bmap.BuildOptions{Reader: bmap.ReaderNumpy})
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	first := func(t *testing.T, build func(*testing.T, *attackFS) *bmap.Map, w who, be string) layout {
		a := newAttackFS(t)
		m := build(t, a)
		sock := daemon(t, m)
		c := connectAs(t, sock, w)
		s, _, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds",
			Request: loader.Request{Backend: be, ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}})
		if code != http.StatusOK {
			t.Fatalf("open as uid %d: %d %s", w.uid, code, msg)
		}
		var nb wire.NextResponse
		if code, msg := c.call("POST", "/v1/sessions/"+s.id+"/next", nil, &nb); code != http.StatusOK {
			t.Fatalf("next: %d %s", code, msg)
		}
		if len(nb.Failed) != 1 {
			t.Fatalf("uid %d: failed %v, want the 0600 sample alone", w.uid, nb.Failed)
		}
		return layout{nb.Offsets, nb.Lengths, nb.Labels, nb.Failed}
	}
	for _, tc := range []struct {
		name       string
		small, big func(*testing.T, *attackFS) *bmap.Map
	}{
		{"ragged", jpg(10), jpg(40 << 10)},
		{"numpy", numpy([]int64{30, 50}), numpy([]int64{70, 130})},
	} {
		for _, be := range []string{"file", "gds"} {
			for _, w := range []who{nobodyWho, {43119, 43119, nil}} {
				t.Run(fmt.Sprintf("%s/%s/uid%d", tc.name, be, w.uid), func(t *testing.T) {
					small, big := first(t, tc.small, w, be), first(t, tc.big, w, be)
					if fmt.Sprint(small) != fmt.Sprint(big) {
						t.Errorf("the batch's layout depends on the refused sample's size:\n small %+v\n big   %+v", small, big)
					}
				})
			}
		}
	}
}

// TestAttackROIOverflow: regions whose packed size wraps int64 (a padded
// region of 2^32×2^32 elements, or 2^21 cubed of 8-byte items) are
// refused at the open (400), and a session never fails on them inside.
func TestAttackROIOverflow(t *testing.T) {
	a := newAttackFS(t)
	h, err := npy.Encode(npy.Header{DType: npy.Float64, Shape: []int64{4, 4, 4}})
	if err != nil {
		t.Fatal(err)
	}
	a.fs.WriteFile(t, "np/a.npy", append(h, make([]byte, 512)...))
	a.fs.Sync(t)
	m, err := bmap.Build(context.Background(), a.fs.Path("np"), bmap.BuildOptions{Reader: bmap.ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	sock := daemon(t, m)
	c := connectAs(t, sock, nobodyWho)
	for _, shape := range [][]int64{{1 << 32, 1 << 32, 1}, {1 << 21, 1 << 21, 1 << 21}, {1 << 62, 4, 4}, {3, 1 << 61, 1 << 61}} {
		s, _, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: "file",
			ROI: &loader.ROI{Shape: shape, Policy: loader.PolicyPad}, ReaderArgs: loader.ReaderArgs{BatchSize: 1, NumShards: 1}}})
		if code == http.StatusOK {
			var nb wire.NextResponse
			code, msg = c.call("POST", "/v1/sessions/"+s.id+"/next", nil, &nb)
			t.Errorf("roi_shape %v: opened; next: %d %q %v, want a 400 at the open", shape, code, msg, nb.Lengths)
			continue
		}
		if code != http.StatusBadRequest {
			t.Errorf("roi_shape %v: %d %q, want 400", shape, code, msg)
		}
	}
}

// TestAttackChangeDuringCheckingPass: while the background checking pass
// runs over a dataset of 3000 raw samples, their owner (root, trusted)
// makes some 0600 and writes the secret into them through a hard link
// outside the root; nobody, reading raw (gds) from the start, gets no
// byte of the secret: each changed sample fails or is served with bytes
// it could read.
func TestAttackChangeDuringCheckingPass(t *testing.T) {
	a := newAttackFS(t)
	const n = 3000
	body := bytes.Repeat([]byte("PUBLIC.."), 1024)
	for i := range n {
		a.fs.WriteFile(t, fmt.Sprintf("big/c/%04d.jpg", i), body)
	}
	os.MkdirAll(a.fs.Path("links"), 0o700)
	a.fs.Sync(t)
	m, err := bmap.Build(context.Background(), a.fs.Path("big"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sock := daemonWith(t, Config{Datasets: map[string]*bmap.Map{"ds": m}, SessionTimeout: time.Minute, CheckInBackground: true})
	c := connectAs(t, sock, nobodyWho)
	s, _, code, msg := c.openReq(wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: "gds", ReaderArgs: loader.ReaderArgs{BatchSize: 64, NumShards: 1}}})
	if code != http.StatusOK {
		t.Fatalf("open: %d %s", code, msg)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sec := bytes.Repeat(secret, len(body)/len(secret))
		for i := 0; i < n; i += 7 {
			p := a.fs.Path(fmt.Sprintf("big/c/%04d.jpg", i))
			l := a.fs.Path(fmt.Sprintf("links/%04d", i))
			if err := os.Link(p, l); err != nil {
				continue
			}
			os.Chmod(l, 0o600)
			f, err := os.OpenFile(l, os.O_WRONLY, 0)
			if err == nil {
				f.WriteAt(sec, 0)
				f.Close()
			}
		}
	}()
	for e := 0; e < 3; e++ {
		got, _ := s.epoch(m) // scans the batch memory for the secret after every batch
		for p, b := range got {
			if bytes.Contains(b, secret) {
				t.Fatalf("epoch %d: %s served with the secret", e, p)
			}
		}
	}
	<-done
	got, _ := s.epoch(m)
	for p, b := range got {
		if bytes.Contains(b, secret) {
			t.Fatalf("after the changes: %s served with the secret", p)
		}
	}
}
