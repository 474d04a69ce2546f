// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/internal/testenv"
)

// TestStatusCommand: loaderd status, run as its own process against a
// running daemon, prints the datasets with their counts, the sessions and
// the budgets; --json prints the same answer as one JSON object with the
// keys curl gets from GET /v1/status; run as nobody it answers by
// nobody's rights (nobody's sessions: none); without a daemon it says
// where it looked and exits 1.
func TestStatusCommand(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "loaderd status: runs itself as nobody (euid %d)", os.Geteuid())
	}
	bin := filepath.Join(t.TempDir(), "loaderd")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for d := filepath.Dir(bin); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // nobody runs it
	}
	mapPath := writeMap(t, 5)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	sock := filepath.Join(dir, "loaderd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	var stderr testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--socket", sock, "--socket-mode", "0666", "--dataset", "d=" + mapPath}, &bytes.Buffer{}, &stderr)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d: %s", code, stderr.String())
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never listened: %s", stderr.String())
		}
	}
	status := func(uid uint32, args ...string) (string, string, error) {
		cmd := exec.Command(bin, append([]string{"status"}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		return o.String(), e.String(), err
	}
	tests := []struct {
		name string
		uid  uint32
		args []string
		want []string
	}{
		{"root text", 0, []string{"--socket", sock}, []string{"datasets:\n  d: 5 samples", "fresh ", "sessions:\n  none", "budgets:", "batch memory", "gpu batch memory", "sessions  ", "connections"}},
		{"nobody text", 65534, []string{"--socket", sock}, []string{"d: 5 samples", "sessions:\n  none", "sessions of the caller   0 of 16"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, err := status(tt.uid, tt.args...)
			if err != nil {
				t.Fatalf("loaderd status: %v: %s", err, errOut)
			}
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("the text lacks %q:\n%s", w, out)
				}
			}
		})
	}
	t.Run("json", func(t *testing.T) {
		out, errOut, err := status(0, "--socket", sock, "--json")
		if err != nil {
			t.Fatalf("loaderd status --json: %v: %s", err, errOut)
		}
		var v struct {
			Datasets []map[string]any `json:"datasets"`
			Sessions []any            `json:"sessions"`
			Budgets  []map[string]any `json:"budgets"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("not JSON: %v\n%s", err, out)
		}
		if len(v.Datasets) != 1 || v.Datasets[0]["name"] != "d" || v.Datasets[0]["samples"] != 5.0 || v.Sessions == nil || len(v.Budgets) != 6 {
			t.Errorf("--json: %s", out)
		}
	})
	t.Run("no daemon", func(t *testing.T) {
		missing := filepath.Join(dir, "none.sock")
		_, errOut, err := status(0, "--socket", missing)
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(errOut, "is loaderd listening on "+missing) {
			t.Errorf("exit %v, stderr %q", err, errOut)
		}
	})
}

// TestWriteStatusUnits: the freshness counts are of the files the guard
// judges. For a webdataset those are its tars, and the text says so.
func TestWriteStatusUnits(t *testing.T) {
	i := func(v int) *int { return &v }
	tests := []struct {
		reader string
		want   []string
	}{
		{"file", []string{"d: 100 samples", "samples: fresh 3  stale 1", "read through the filesystem: 1 samples changed since mapping"}},
		{"webdataset", []string{"d: 100 samples", "tars: fresh 3  stale 1", "read through the filesystem: 1 tars changed since mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.reader, func(t *testing.T) {
			var st wire.StatusResponse
			st.Datasets = []wire.DatasetStatus{{
				DatasetInfo: wire.DatasetInfo{Name: "d", Readable: true, Reader: tt.reader, Samples: i(100), Fresh: i(3), Stale: i(1)},
				StaleCauses: []wire.StaleCause{{Cause: "changed_since_mapping", Samples: 1, Fix: "remap"}},
			}}
			var b bytes.Buffer
			writeStatus(&b, st)
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("the text lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}
