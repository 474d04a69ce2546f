package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "--mountpoint is required"},
		{[]string{"--mountpoint", "/nonexistent/x"}, 2, "/nonexistent/x"},
		{[]string{"--mountpoint", "/", "--format", "yaml"}, 2, `unknown format "yaml"`},
		{[]string{"--bogus"}, 2, "bogus"},
		{[]string{"inspect"}, 2, "one map file"},
		{[]string{"inspect", "/nonexistent.bmap"}, 1, "/nonexistent.bmap"},
	}
	for _, tt := range tests {
		code, _, stderr := runCmd(t, tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("mkbmap %q: exit %d, stderr %q; want exit %d mentioning %q", tt.args, code, stderr, tt.code, tt.want)
		}
		if strings.Contains(stderr, "goroutine") {
			t.Errorf("mkbmap %q printed a stack trace", tt.args)
		}
	}
}

func TestRefusedFilesystemWritesNothing(t *testing.T) {
	for _, typ := range []string{"btrfs", "tmpfs"} {
		t.Run(typ, func(t *testing.T) {
			fs := testfs.New(t, testfs.Options{Type: typ})
			fs.WriteFile(t, "c/x.jpg", []byte("data"))
			out := filepath.Join(t.TempDir(), "out.bmap")
			code, _, stderr := runCmd(t, "--mountpoint", fs.Dir, "-o", out)
			if code != 1 || !strings.Contains(stderr, typ) {
				t.Errorf("exit %d, stderr %q: want 1 naming %s", code, stderr, typ)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("output file exists after refusal: %v", err)
			}
			if ents, _ := os.ReadDir(filepath.Dir(out)); len(ents) != 0 {
				t.Errorf("leftover files: %v", ents)
			}
		})
	}
}

func TestMapInspectConvertVerify(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	fs.WriteFile(t, "train/b/1.jpg", bytes.Repeat([]byte("x"), 70_000))
	fs.WriteFile(t, "train/a/2.JPG", bytes.Repeat([]byte("y"), 5000))
	fs.WriteFile(t, "train/a/tiny.jpg", []byte("z"))
	fs.Sync(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "m.bmap")
	code, _, stderr := runCmd(t, "--mountpoint", fs.Path("train"), "-o", out, "--verify")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"3 samples", "75001 bytes", "1 filesystem-only (inline data: 1)", "samples/s", "verify: 2 raw samples"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("summary %q lacks %q", stderr, want)
		}
	}
	code, stdout, stderr := runCmd(t, "inspect", out)
	if code != 0 || !strings.Contains(stdout, "3 samples") || !strings.Contains(stdout, fs.Dev) {
		t.Errorf("inspect: exit %d, %q %q", code, stdout, stderr)
	}
	code, stdout, _ = runCmd(t, "inspect", "--format", "json", out)
	var j struct {
		Classes []string
		Samples []struct {
			Path  string
			Label int
			Raw   bool
		}
	}
	if err := json.Unmarshal([]byte(stdout), &j); code != 0 || err != nil {
		t.Fatalf("inspect --format json: exit %d, %v", code, err)
	}
	if len(j.Samples) != 3 || j.Samples[0].Path != "a/2.JPG" || j.Samples[2].Label != 1 || j.Classes[1] != "b" {
		t.Errorf("json = %+v", j)
	}
	// xnvme-json out and back in.
	xn := filepath.Join(dir, "x.json")
	if code, _, stderr := runCmd(t, "--mountpoint", fs.Path("train"), "--format", "xnvme-json", "-o", xn); code != 0 || !strings.Contains(stderr, "1 of 3 left out") {
		t.Errorf("xnvme-json: exit %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "inspect", xn); code != 2 || !strings.Contains(stderr, "--mountpoint") {
		t.Errorf("xnvme inspect without root: exit %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "inspect", "--mountpoint", fs.Path("train"), "--verify", xn); code != 0 || !strings.Contains(stderr, "2 match") {
		t.Errorf("xnvme inspect: exit %d %q", code, stderr)
	}
	// A corrupt map is refused with its name, and a failed write keeps the old file.
	b, _ := os.ReadFile(out)
	b[len(b)-1] ^= 1
	bad := filepath.Join(dir, "bad.bmap")
	os.WriteFile(bad, b, 0o644)
	if code, _, stderr := runCmd(t, "inspect", bad); code != 1 || !strings.Contains(stderr, "bad.bmap") || !strings.Contains(stderr, "checksum") {
		t.Errorf("corrupt: exit %d %q", code, stderr)
	}
	if _, err := bmap.Load(out); err != nil {
		t.Errorf("original map damaged: %v", err)
	}
	// Verify catches a changed file.
	os.WriteFile(fs.Path("train/b/1.jpg"), []byte("changed"), 0o644)
	if code, _, stderr := runCmd(t, "inspect", "--verify", out); code != 1 || !strings.Contains(stderr, "b/1.jpg") {
		t.Errorf("verify after change: exit %d %q", code, stderr)
	}
}
