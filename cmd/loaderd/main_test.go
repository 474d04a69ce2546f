// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

func runCmd(args ...string) (int, string, string) {
	var o, e bytes.Buffer
	code := run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

// writeMap makes a small dataset and writes its map; it returns the map path.
func writeMap(t *testing.T, n int) string {
	root := filepath.Join(t.TempDir(), "train")
	for i := 0; i < n; i++ {
		p := filepath.Join(root, fmt.Sprintf("c%d", i%3), fmt.Sprintf("%04d.jpg", i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, bytes.Repeat([]byte{byte(i)}, 1000+i*37), 0o644)
	}
	path := filepath.Join(t.TempDir(), "m.bmap")
	if _, err := bmap.WriteFile(path, testfs.MapDir(t, root), bmap.FormatBinary); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestBenchJSON(t *testing.T) {
	m := writeMap(t, 50)
	code, stdout, stderr := runCmd("bench", "--bmap", m, "--batch-size", "8", "--epochs", "2", "--shuffle", "--verify", "--json", "--prefetch", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res map[string]any
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&res); err != nil || dec.More() {
		t.Fatalf("stdout is not exactly one JSON object: %v: %q", err, stdout)
	}
	for _, k := range []string{"backend", "samples", "bytes", "seconds", "samples_per_s", "bytes_per_s", "batch_ms_p50", "batch_ms_p99", "cpu_seconds"} {
		if _, ok := res[k]; !ok {
			t.Errorf("JSON lacks %q: %v", k, res)
		}
	}
	var wantBytes int
	for i := 0; i < 50; i++ {
		wantBytes += 1000 + i*37
	}
	if res["samples"] != 100.0 || res["bytes"] != float64(2*wantBytes) || res["backend"] != "file" || res["verified"] != 100.0 {
		t.Errorf("result %v: want 100 samples, %d bytes, verified 100", res, 2*wantBytes)
	}
	code, stdout, stderr = runCmd("bench", "--bmap", m, "--batch-size", "8", "--epochs", "2", "--shuffle", "--shuffle-mode", "dali", "--initial-fill", "16",
		"--num-shards", "2", "--shard-id", "1", "--pad-last-batch", "--stick-to-shard", "--verify", "--json")
	if code != 0 || !strings.Contains(stdout, `"samples":64,`) || !strings.Contains(stdout, `"verified":64,`) {
		t.Errorf("--shuffle-mode dali: exit %d %q %s (want 2 epochs of 25 samples padded to 32, verified)", code, stdout, stderr)
	}
	code, stdout, _ = runCmd("bench", "--bmap", m, "--batch-size", "8", "--batches", "3")
	if code != 0 || !strings.Contains(stdout, "samples/s") || !strings.Contains(stdout, "file") {
		t.Errorf("table output: exit %d %q", code, stdout)
	}
}

func TestBenchErrors(t *testing.T) {
	m := writeMap(t, 5)
	tests := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "no command"},
		{[]string{"serve2"}, 2, `unknown command "serve2"`},
		{[]string{"bench"}, 2, "--bmap is required"},
		{[]string{"bench", "--bmap", m, "--batch-size", "0"}, 2, "batch_size 0"},
		{[]string{"bench", "--bmap", m, "--backend", "nope"}, 2, `unknown backend "nope"`},
		{[]string{"bench", "--bmap", m, "--shard-id", "3", "--num-shards", "2"}, 2, "shard_id 3"},
		{[]string{"bench", "--bmap", m, "--num-shards", "0"}, 2, "--num-shards 0: num_shards 0 not in [1, 2147483647]"},
		{[]string{"bench", "--bmap", m, "--prefetch", "0"}, 2, "--prefetch 0: prefetch_queue_depth 0 not in [1, 64]"},
		{[]string{"bench", "--bmap", m, "--shuffle", "--shuffle-mode", "dali", "--initial-fill", "0"}, 2, "initial_fill 0 not in [1, 16777216]"},
		{[]string{"bench", "--bmap", m, "--shuffle", "--shuffle-mode", "buffer"}, 2, `shuffle "buffer" (want "permute" or "dali"`},
		{[]string{"bench", "--bmap", m, "--shuffle", "--shuffle-mode", "dali", "--initial-fill", "-1"}, 2, "initial_fill -1 not in [1, 16777216]"},
		{[]string{"bench", "--bmap", "/nonexistent.bmap"}, 1, "/nonexistent.bmap"},
		{[]string{"serve", "--socket", "/tmp/x.sock", "--dataset", "d=" + m, "--engines", "node"}, 2, `--engines "node": want device or session`},
	}
	for _, tt := range tests {
		code, _, stderr := runCmd(tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("loaderd %q: exit %d %q; want %d mentioning %q", tt.args, code, stderr, tt.code, tt.want)
		}
	}
	// A changed file is a named error, exit 1.
	mm, _ := bmap.Load(m)
	os.Remove(filepath.Join(mm.Root, mm.Samples[2].Path))
	code, _, stderr := runCmd("bench", "--bmap", m, "--batch-size", "2")
	if code != 1 || !strings.Contains(stderr, mm.Samples[2].Path) {
		t.Errorf("missing file: exit %d %q", code, stderr)
	}
}
