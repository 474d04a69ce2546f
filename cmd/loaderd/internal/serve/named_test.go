// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/npy"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/loader"
)

// TestAttackOpenNamesNoFileBeforeAccess: an open of a dataset the caller
// may not read is refused with 403 before any answer that tells what only
// its readers may know. The dataset is a numpy map of two dtypes (not
// served: its 400 names two files and their dtypes), one file in a 0700
// folder; before, nobody's open got that 400 (naming the hidden file and
// its dtype), and an open with another fingerprint a 409 naming the
// dataset's. Now both get 403 naming the one path refused; root gets the
// 400 and the 409.
func TestAttackOpenNamesNoFileBeforeAccess(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "the attacker connects as other users (euid %d)", os.Geteuid())
	}
	root := filepath.Join(publicDir(t), "np")
	for _, f := range []struct {
		rel   string
		dtype npy.DType
	}{{"a.npy", npy.Float32}, {"b.npy", npy.Float32}, {"hidden/c.npy", npy.Int64}} {
		h, err := npy.Encode(npy.Header{DType: f.dtype, Shape: []int64{4}})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, f.rel)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, append(h, make([]byte, 4*f.dtype.ItemSize())...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(root, 0o755)
	if err := os.Chmod(filepath.Join(root, "hidden"), 0o700); err != nil {
		t.Fatal(err)
	}
	m, err := bmap.Build(context.Background(), root, bmap.BuildOptions{Reader: bmap.ReaderNumpy})
	if err != nil {
		t.Fatal(err)
	}
	sock := daemon(t, m)
	args := loader.ReaderArgs{BatchSize: 2, NumShards: 1}
	refused := filepath.Join(root, "hidden", "…") // hidden is 0700: the caller may not list it, so c.npy is not named
	for _, w := range []who{nobodyWho, throwawayWho} {
		c := connectAs(t, sock, w)
		for _, req := range []wire.OpenRequest{{Dataset: "ds", Request: loader.Request{ReaderArgs: args}}, {Dataset: "ds", Request: loader.Request{ReaderArgs: args}, Fingerprint: "0123456789abcdef0123456789abcdef"}} {
			code, msg := c.call("POST", "/v1/sessions", req, nil)
			t.Logf("uid %d, fingerprint %q: %d %s", w.uid, req.Fingerprint, code, msg)
			if code != http.StatusForbidden {
				t.Errorf("uid %d, fingerprint %q: %d %q, want 403", w.uid, req.Fingerprint, code, msg)
			}
			for _, leak := range []string{"int64", "float32", "a.npy", "b.npy", "c.npy", m.Fingerprint()} {
				if strings.Contains(msg, leak) {
					t.Errorf("uid %d, fingerprint %q: the refusal tells %q: %s", w.uid, req.Fingerprint, leak, msg)
				}
			}
			if code == http.StatusForbidden && (strings.Count(msg, root) != 1 || !strings.Contains(msg, refused+": permission denied")) {
				t.Errorf("uid %d: the refusal %q should name one path, the one refused as far as the caller may list it (%s)", w.uid, msg, refused)
			}
		}
	}
	rc := unixClient(sock)
	if code, raw := rc.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: args}}, nil); code != http.StatusBadRequest || !strings.Contains(string(raw), "more than one dtype") {
		t.Errorf("root's open: %d %s, want 400 saying why the dataset is not served", code, raw)
	}
	want := fmt.Sprintf("has fingerprint %s", m.Fingerprint())
	if code, raw := rc.call(t, "POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{ReaderArgs: args}, Fingerprint: "0123456789abcdef0123456789abcdef"}, nil); code != http.StatusConflict || !strings.Contains(string(raw), want) {
		t.Errorf("root's open with another fingerprint: %d %s, want 409 naming the dataset's", code, raw)
	}
}
