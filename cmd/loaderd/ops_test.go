// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

// TestHelp: --help prints one command's usage and flags on stdout and
// exits 0; the overview comes from loaderd --help and loaderd help; a bad
// flag prints the usage line on stderr and exits 2.
func TestHelp(t *testing.T) {
	tests := []struct {
		args       []string
		code       int
		stdout     string // in stdout
		notStdout  string // not in stdout
		stderr     string // in stderr ("" : stderr empty)
		notInOther string
	}{
		{args: []string{"--help"}, stdout: "commands:\n  serve"},
		{args: []string{"-h"}, stdout: "commands:\n  serve"},
		{args: []string{"help"}, stdout: "commands:\n  serve"},
		{args: []string{"serve", "--help"}, stdout: "usage: loaderd serve", notStdout: "loaderd bench"},
		{args: []string{"serve", "-h"}, stdout: "-log-format string"},
		{args: []string{"help", "serve"}, stdout: "usage: loaderd serve", notStdout: "loaderd bench"},
		{args: []string{"bench", "--help"}, stdout: "-bmap string", notStdout: "loaderd serve"},
		{args: []string{"reload", "--help"}, stdout: "usage: loaderd reload", notStdout: "loaderd serve ["},
		{args: []string{"backends", "--help"}, stdout: "usage: loaderd backends", notStdout: "loaderd serve"},
		{args: []string{"check", "--help"}, stdout: "usage: loaderd check", notStdout: "loaderd serve"},
		{args: []string{"serve", "--nope"}, code: 2, stderr: "usage: loaderd serve [--config FILE]", notStdout: "usage"},
		{args: []string{"bench", "--nope"}, code: 2, stderr: "usage: loaderd bench --bmap FILE"},
		{args: []string{"reload", "extra"}, code: 2, stderr: `unexpected argument "extra"`},
		{args: []string{"serve", "--socket", "/tmp/x.sock", "--dataset", "d=/x", "--log-format", "xml"}, code: 2, stderr: `--log-format "xml": want text or json`},
		{args: []string{"serve", "--socket", "/tmp/x.sock", "--dataset", "d=/x", "--log-level", "loud"}, code: 2, stderr: `--log-level "loud"`},
		{args: []string{"frobnicate"}, code: 2, stderr: `unknown command "frobnicate"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := runCmd(tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if !strings.Contains(stdout, tt.stdout) || (tt.notStdout != "" && strings.Contains(stdout, tt.notStdout)) {
				t.Errorf("stdout %q: want %q, not %q", stdout, tt.stdout, tt.notStdout)
			}
			if tt.stderr == "" && stderr != "" || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stderr %q, want %q", stderr, tt.stderr)
			}
		})
	}
}

// TestLogFlags: the flags make the logger asked for.
func TestLogFlags(t *testing.T) {
	tests := []struct {
		args      []string
		json      bool
		debug     bool // debug lines pass
		info      bool // info lines pass
		wantError string
	}{
		{args: nil, info: true},
		{args: []string{"--log-format", "json"}, json: true, info: true},
		{args: []string{"--log-level", "debug"}, debug: true, info: true},
		{args: []string{"--log-level", "WARN", "--log-format", "json"}, json: true},
		{args: []string{"--log-level", "error"}},
		{args: []string{"--log-format", "logfmt"}, wantError: "want text or json"},
		{args: []string{"--log-level", "verbose"}, wantError: "want debug, info, warn or error"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			l := addLogFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log, err := l.logger(&buf)
			if tt.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantError) {
					t.Fatalf("err %v, want %q", err, tt.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("d")
			log.Info("i")
			log.Warn("w", "k", "v")
			out := buf.String()
			if strings.Contains(out, `"d"`) || strings.Contains(out, "msg=d") {
				if !tt.debug {
					t.Errorf("debug logged: %q", out)
				}
			} else if tt.debug {
				t.Errorf("debug not logged: %q", out)
			}
			if got := strings.Contains(out, `"i"`) || strings.Contains(out, "msg=i"); got != tt.info {
				t.Errorf("info logged %v, want %v: %q", got, tt.info, out)
			}
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var v map[string]any
				if isJSON := json.Unmarshal([]byte(line), &v) == nil; isJSON != tt.json {
					t.Errorf("line %q: JSON %v, want %v", line, isJSON, tt.json)
				}
			}
		})
	}
}

// TestJSONLogDurations: a JSON log gives every time as float seconds
// under a key ending in "seconds", a time.Duration included (slog's JSON
// handler alone writes integer nanoseconds).
func TestJSONLogDurations(t *testing.T) {
	tests := []struct {
		attr    slog.Attr
		key     string
		seconds float64
	}{
		{slog.Duration("read_timeout", 30*time.Second), "read_timeout_seconds", 30},
		{slog.Duration("wait", 1500*time.Microsecond), "wait_seconds", 0.0015},
		{slog.Duration("seconds", 2*time.Second), "seconds", 2},
		{slog.Float64("seconds", 0.25), "seconds", 0.25},
		{slog.Group("g", slog.Duration("idle", time.Minute)), "g.idle_seconds", 60},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			l := addLogFlags(fs)
			if err := fs.Parse([]string{"--log-format", "json"}); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log, err := l.logger(&buf)
			if err != nil {
				t.Fatal(err)
			}
			log.Info("m", tt.attr)
			var v map[string]any
			if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
				t.Fatalf("%q: %v", buf.String(), err)
			}
			var got any = v
			for _, k := range strings.Split(tt.key, ".") {
				got = got.(map[string]any)[k]
			}
			if f, ok := got.(float64); !ok || f != tt.seconds {
				t.Errorf("%s = %v in %s, want %v seconds", tt.key, got, buf.String(), tt.seconds)
			}
		})
	}
}

// TestServeReload: a daemon started with --log-format json logs JSON
// lines only; loaderd reload makes it read its map again (a map that no
// longer loads: exit 1, the dataset kept), and so does SIGHUP.
func TestServeReload(t *testing.T) {
	// The test binary keeps a SIGHUP handler of its own while this test
	// runs: a SIGHUP that reaches the process when no daemon's handler is
	// installed (before it starts, after it stops) must not end the whole
	// test binary ("signal: hangup").
	own := make(chan os.Signal, 1)
	signal.Notify(own, syscall.SIGHUP)
	defer signal.Stop(own)
	mapPath := writeMap(t, 5)
	good, err := os.ReadFile(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "run", "loaderd.sock") // its directory is made
	ctx, cancel := context.WithCancel(context.Background())
	var stderr testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--socket", sock, "--dataset", "d=" + mapPath, "--log-format", "json", "--log-level", "debug"}, &bytes.Buffer{}, &stderr)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never listened: %s", stderr.String())
		}
	}
	code, stdout, errOut := runCmd("reload", "--socket", sock)
	if code != 0 || stdout != "d: reloaded, 5 samples\n" {
		t.Errorf("reload: exit %d %q %q", code, stdout, errOut)
	}
	if err := os.WriteFile(mapPath, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, errOut = runCmd("reload", "--socket", sock)
	if code != 1 || !strings.HasPrefix(stdout, "d: failed, serving 5 samples as before: "+mapPath) || !strings.Contains(errOut, "1 of 1 maps did not load") {
		t.Errorf("reload of a broken map: exit %d %q %q", code, stdout, errOut)
	}
	os.WriteFile(mapPath, good, 0o644)
	// The first reload above logged "failed":0 already: wait for the
	// signal's own delivery and then for a new line, so the handlers are
	// never stopped while the kernel still holds the signal (on a busy
	// machine it reaches the process many milliseconds after kill).
	before := strings.Count(stderr.String(), `"failed":0`)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	select {
	case <-own:
	case <-time.After(10 * time.Second):
		t.Fatal("the SIGHUP sent to this process never arrived")
	}
	for deadline := time.Now().Add(10 * time.Second); strings.Count(stderr.String(), `"failed":0`) == before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not reload: %s", stderr.String())
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	}
	out := strings.TrimSpace(stderr.String())
	for _, line := range strings.Split(out, "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("not a JSON line: %q", line)
		}
	}
	if !strings.Contains(out, `"msg":"serve: listening"`) || !strings.Contains(out, `"level":"WARN"`) || !strings.Contains(out, `"read_timeout_seconds":30`) {
		t.Errorf("the log lacks the listening line or the failed map's warning:\n%s", out)
	}
}
