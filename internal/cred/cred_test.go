// SPDX-License-Identifier: Apache-2.0

package cred

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/internal/testenv"
)

const nobody = 65534

// dir makes a directory the test's unprivileged credentials can search.
func dir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(d), 0o755); err != nil { // t.TempDir's parent is 0700
		t.Fatal(err)
	}
	return d
}

func mustRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "cred: switching credentials needs root (euid %d)", os.Geteuid())
	}
}

func TestDoJudgesAsTheCred(t *testing.T) {
	mustRoot(t)
	d := dir(t)
	write := func(name string, mode os.FileMode, gid int) string {
		p := filepath.Join(d, name)
		if err := os.WriteFile(p, []byte(name), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 0, gid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	private := write("private", 0o600, 0)
	group := write("group", 0o640, 4242)
	public := write("public", 0o644, 0)
	hidden := filepath.Join(d, "hidden")
	os.Mkdir(hidden, 0o700)
	os.WriteFile(filepath.Join(hidden, "f"), []byte("x"), 0o644)
	link := filepath.Join(d, "link")
	os.Symlink(filepath.Join(hidden, "f"), link)

	for _, tc := range []struct {
		name string
		c    Cred
		path string
		want error
	}{
		{"root-only file", Cred{UID: nobody, GID: nobody}, private, unix.EACCES},
		{"public file", Cred{UID: nobody, GID: nobody}, public, nil},
		{"group file, in the group", Cred{UID: nobody, GID: nobody, Groups: []uint32{4242}}, group, nil},
		{"group file, group dropped", Cred{UID: nobody, GID: nobody}, group, unix.EACCES},
		{"group file, primary group", Cred{UID: nobody, GID: 4242}, group, nil},
		{"symlink into a 0700 directory", Cred{UID: nobody, GID: nobody}, link, unix.EACCES},
		{"root", Cred{}, private, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Do(func() error {
				fd, err := unix.Open(tc.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err == nil {
					unix.Close(fd)
				}
				return err
			})
			if !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
				t.Fatalf("open %s as %v: %v, want %v", tc.path, tc.c, err, tc.want)
			}
		})
	}
	// The process itself is unchanged: every other thread still reads as root.
	for range 2 * runtime.GOMAXPROCS(0) {
		if _, err := os.ReadFile(private); err != nil {
			t.Fatalf("after Do, the process lost root's access: %v", err)
		}
	}
}

func TestOpener(t *testing.T) {
	mustRoot(t)
	d := dir(t)
	p := filepath.Join(d, "private")
	os.WriteFile(p, []byte("x"), 0o600)
	o, err := NewOpener(Cred{UID: nobody, GID: nobody}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.Openat(unix.AT_FDCWD, p, unix.O_RDONLY); !errors.Is(err, unix.EACCES) {
		t.Fatalf("open of a 0600 root file as nobody: %v, want EACCES", err)
	}
	os.Chmod(p, 0o644)
	fd, err := o.Openat(unix.AT_FDCWD, p, unix.O_RDONLY)
	if err != nil {
		t.Fatalf("open of a 0644 file as nobody: %v", err)
	}
	unix.Close(fd)
}

// TestPeer checks that Peer reports the connecting process's own groups.
func TestPeer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("unix", sock)
		if err == nil {
			defer c.Close()
			buf := make([]byte, 1)
			c.Read(buf)
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, _ := c.(*net.UnixConn).SyscallConn()
	var got Cred
	var perr error
	raw.Control(func(fd uintptr) { got, perr = Peer(int(fd)) })
	if perr != nil {
		t.Fatal(perr)
	}
	want, _ := os.Getgroups()
	if got.UID != uint32(os.Geteuid()) || got.GID != uint32(os.Getegid()) || len(got.Groups) != len(want) {
		t.Fatalf("Peer = %v, want uid %d gid %d groups %v", got, os.Geteuid(), os.Getegid(), want)
	}
}
