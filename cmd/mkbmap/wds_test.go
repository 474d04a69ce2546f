// SPDX-License-Identifier: Apache-2.0

package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWebDataset: --reader webdataset maps a folder's tars (sorted, the
// others ignored) and a --file-list of them; mkbmap samples lists a
// selection; the flags of other readers, other formats and a compressed
// shard are refused saying why.
func TestWebDataset(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, members ...string) {
		var b bytes.Buffer
		w := tar.NewWriter(&b)
		for _, m := range members {
			w.WriteHeader(&tar.Header{Name: m, Size: int64(len(m)), Mode: 0o644})
			w.Write([]byte(m))
		}
		w.Close()
		os.WriteFile(filepath.Join(dir, name), b.Bytes(), 0o644)
	}
	mk("b.tar", "k2.jpg", "k2.cls")
	mk("a.tar", "k0.jpg", "k0.cls", "k1.jpg")
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644)
	out := filepath.Join(dir, "m.bmap")
	if code, _, stderr := runCmd(t, "--reader", "webdataset", "--mountpoint", dir, "-o", out); code != 0 || !strings.Contains(stderr, "2 shards, 3 samples, 5 components") {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	code, stdout, stderr := runCmd(t, "samples", "--ext", "jpg,cls", "--missing", "skip", out)
	want := `{"shard":"a.tar","key":"k0","outputs":[[512,6,"k0.jpg"],[1536,6,"k0.cls"]]}` + "\n" +
		`{"shard":"b.tar","key":"k2","outputs":[[512,6,"k2.jpg"],[1536,6,"k2.cls"]]}` + "\n"
	if code != 0 || stdout != want {
		t.Fatalf("samples: exit %d, %s\n%s", code, stderr, stdout)
	}
	list := filepath.Join(dir, "list.txt")
	os.WriteFile(list, []byte("b.tar\n"), 0o644)
	if code, _, stderr := runCmd(t, "--reader", "webdataset", "--file-list", list, "-o", out); code != 0 || !strings.Contains(stderr, "1 shards, 1 samples") {
		t.Fatalf("--file-list: exit %d: %s", code, stderr)
	}
	os.WriteFile(filepath.Join(dir, "c.tar"), []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0}, 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--reader", "webdataset", "--mountpoint", dir, "-o", out}, 1, "c.tar: compressed tar"},
		{[]string{"--reader", "webdataset", "--mountpoint", dir, "--format", "json"}, 2, "version 3 .bmap only"},
		{[]string{"--reader", "webdataset", "--mountpoint", dir, "--filter", "*.x"}, 2, "--filter does not apply"},
		{[]string{"--mountpoint", dir, "--index-paths", list}, 2, "--index-paths is fn.readers.webdataset's"},
		{[]string{"samples", "--ext", "jpg", "--missing", "maybe", out}, 2, "possible values are skip, error, empty"},
		{[]string{"samples", out}, 2, "give --ext"},
	} {
		if code, _, stderr := runCmd(t, tc.args...); code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("mkbmap %q: exit %d, %s; want %d mentioning %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}
