// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/caps"
	"github.com/nvfeed/nvfeed/internal/testenv"
)

// asLoaderd is the variable that makes the test binary run loaderd itself
// (TestMain): a test starts it as a process of its own, under setpriv.
const asLoaderd = "NVFEED_TEST_AS_LOADERD"

func TestMain(m *testing.M) {
	if os.Getenv(asLoaderd) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// full is every capability this kernel knows.
const full = caps.Set(1)<<(unix.CAP_LAST_CAP+1) - 1

// TestCheckCaps: as root a missing required capability refuses the start,
// naming each and what needs it; a wanted one is a warning naming its
// cost; a daemon that is not root is told what works.
func TestCheckCaps(t *testing.T) {
	for _, tc := range []struct {
		name    string
		have    caps.Set
		euid    int
		group   string
		errs    []string // in the error, in order; none: no error
		warns   []string // in the log
		noWarns []string // not in the log
	}{
		{name: "root, every capability", have: full, group: "loaderd", noWarns: []string{"missing"}},
		{name: "root without CAP_SETUID and CAP_SETGID", have: full.Without(unix.CAP_SETUID).Without(unix.CAP_SETGID),
			errs: []string{"CAP_SETUID missing: loaderd switches to each caller's uid", "add it to the unit's CapabilityBoundingSet",
				"CAP_SETGID missing: loaderd takes each caller's gid and supplementary groups"}},
		{name: "root without CAP_SETGID", have: full.Without(unix.CAP_SETGID), errs: []string{"CAP_SETGID missing"}},
		{name: "root without CAP_DAC_READ_SEARCH", have: full.Without(unix.CAP_DAC_READ_SEARCH), errs: []string{"CAP_DAC_READ_SEARCH missing"}},
		{name: "root without CAP_CHOWN, a socket group", have: full.Without(unix.CAP_CHOWN), group: "4242",
			errs: []string{"CAP_CHOWN missing: loaderd gives its socket the group --socket-group 4242 names"}},
		{name: "root without CAP_CHOWN, no socket group", have: full.Without(unix.CAP_CHOWN), noWarns: []string{"CAP_CHOWN"}},
		{name: "root without the wanted ones", have: full.Without(unix.CAP_IPC_LOCK).Without(unix.CAP_SYS_ADMIN).Without(unix.CAP_DAC_OVERRIDE),
			warns: []string{"CAP_IPC_LOCK missing: without it batch memory is page-locked only within RLIMIT_MEMLOCK",
				"CAP_SYS_ADMIN missing: without it no filesystem-wide fanotify mark", "CAP_DAC_OVERRIDE missing"}},
		{name: "not root, no capabilities", have: 0, euid: 1000,
			warns: []string{"running as uid 1000, not root: it serves only root's requests", "403", "CAP_SETUID CAP_SETGID"}},
		{name: "not root, switching capabilities", have: caps.Set(0).With(unix.CAP_SETUID).With(unix.CAP_SETGID), euid: 1000,
			warns: []string{"running as uid 1000, not root: it checks callers as root would"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := checkCaps(tc.have, tc.euid, capNeeds(tc.group), slog.New(slog.NewTextHandler(&buf, nil)))
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatalf("err %v, want none", err)
				}
			} else {
				if !errors.Is(err, ErrCapabilities) {
					t.Fatalf("err %v, want ErrCapabilities", err)
				}
				for _, w := range tc.errs {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("err %q lacks %q", err, w)
					}
				}
			}
			for _, w := range tc.warns {
				if !strings.Contains(buf.String(), w) {
					t.Errorf("log %q lacks %q", buf.String(), w)
				}
			}
			for _, w := range tc.noWarns {
				if strings.Contains(buf.String(), w) {
					t.Errorf("log %q has %q", buf.String(), w)
				}
			}
		})
	}
}

// setpriv returns the command that runs this test binary as loaderd with
// args, with the capabilities drop removed from its bounding set and no
// inheritable or ambient ones, as a root service whose unit lacks them;
// it skips without root or setpriv.
func setpriv(t *testing.T, drop []string, args ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "loaderd serve's capability check: needs root (euid %d)", os.Geteuid())
	}
	sp, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.SkipPrivileged(t, "loaderd serve's capability check: needs setpriv (util-linux): %v", err)
	}
	bset := []string{}
	for _, c := range drop {
		bset = append(bset, "-"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	cmd := exec.Command(sp, append([]string{"--bounding-set", strings.Join(bset, ","), "--inh-caps", "-all", "--ambient-caps", "-all",
		"--no-new-privs", "--", os.Args[0]}, args...)...)
	cmd.Env = append(os.Environ(), asLoaderd+"=1")
	return cmd
}

// TestServeRefusesWithoutSwitchingCaps: loaderd serve started as root
// with CAP_SETUID or CAP_SETGID (or both) dropped from its bounding set
// exits 1 before it listens, naming each missing capability and what
// needs it; with the capabilities it starts.
func TestServeRefusesWithoutSwitchingCaps(t *testing.T) {
	m := writeMap(t, 5)
	for _, drop := range [][]string{{"CAP_SETUID"}, {"CAP_SETGID"}, {"CAP_SETUID", "CAP_SETGID"}} {
		t.Run(strings.Join(drop, "+"), func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "loaderd.sock")
			cmd := setpriv(t, drop, "serve", "--socket", sock, "--dataset", "d="+m)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 1 {
					t.Fatalf("exit %v, want 1: %s", err, out.String())
				}
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("loaderd serve without %v is still running: %s", drop, out.String())
			}
			for _, c := range drop {
				if want := fmt.Sprintf("%s missing: loaderd ", c); !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			if _, err := os.Stat(sock); err == nil {
				t.Errorf("the socket %s exists: the daemon listened", sock)
			}
		})
	}
	t.Run("with them", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "loaderd.sock")
		cmd := setpriv(t, []string{"CAP_SYS_BOOT"}, "serve", "--socket", sock, "--dataset", "d="+m)
		var out testenv.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cmd.Process.Signal(unix.SIGTERM)
			cmd.Wait()
		}()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the daemon never listened: %s", out.String())
			}
		}
	})
}

// TestServeWarnsRootOnlySocket: a daemon started without --socket-group
// says at start (WARN) that only root can connect and how to let users
// in, never by joining root's group; with --socket-group it does not.
func TestServeWarnsRootOnlySocket(t *testing.T) {
	m := writeMap(t, 5)
	for _, tc := range []struct {
		name  string
		args  []string
		warns bool
	}{
		{"no --socket-group", nil, true},
		{"--socket-group", []string{"--socket-group", fmt.Sprint(os.Getegid())}, false},
		{"--socket-mode 0666", []string{"--socket-mode", "0666"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "loaderd.sock")
			ctx, cancel := context.WithCancel(context.Background())
			var stderr testenv.Buffer
			done := make(chan int, 1)
			go func() {
				done <- run(ctx, append([]string{"serve", "--socket", sock, "--dataset", "d=" + m}, tc.args...), &bytes.Buffer{}, &stderr)
			}()
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if _, err := os.Stat(sock); err == nil {
					break
				}
				if time.Now().After(deadline) {
					cancel()
					t.Fatalf("the daemon never listened: %s", stderr.String())
				}
			}
			cancel()
			if code := <-done; code != 0 {
				t.Fatalf("serve exited %d: %s", code, stderr.String())
			}
			log := stderr.String()
			who := "only root can connect to " + sock
			if os.Geteuid() != 0 || os.Getegid() != 0 {
				who = fmt.Sprintf("only uid %d and members of gid %d", os.Geteuid(), os.Getegid())
			}
			warned := strings.Contains(log, "level=WARN msg=\"loaderd: no --socket-group: "+who)
			if warned != tc.warns {
				t.Fatalf("warned %v, want %v:\n%s", warned, tc.warns, log)
			}
			if tc.warns && !strings.Contains(log, "--socket-group GROUP, or socket-group = GROUP in the config file") {
				t.Errorf("the warning does not say how to let users in:\n%s", log)
			}
			for _, bad := range []string{"usermod -aG root", "join root", "group root", "root group"} {
				if strings.Contains(log, bad) {
					t.Errorf("the log advises %q:\n%s", bad, log)
				}
			}
		})
	}
}
