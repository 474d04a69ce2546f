// SPDX-License-Identifier: Apache-2.0

package testenv

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DialUnixAs connects to the unix socket at path as another user would:
// on a locked OS thread whose effective uid, gid and supplementary groups
// are switched (for that thread only) before socket and connect, so the
// server's SO_PEERCRED and SO_PEERGROUPS report exactly these ids and
// groups, and the socket file's permissions are checked for them. The
// thread ends with the call. Needs root.
func DialUnixAs(path string, uid, gid uint32, groups []uint32) (net.Conn, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		var p unsafe.Pointer
		if len(groups) > 0 {
			p = unsafe.Pointer(&groups[0])
		}
		// Raw system calls: only this thread (setgroups and setresuid of the
		// C library or Go's syscall package apply to every thread).
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
			done <- result{-1, fmt.Errorf("setgroups: %w", e)}
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); e != 0 {
			done <- result{-1, fmt.Errorf("setresgid: %w", e)}
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
			done <- result{-1, fmt.Errorf("setresuid: %w", e)}
			return
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			done <- result{-1, err}
			return
		}
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			unix.Close(fd)
			done <- result{-1, err}
			return
		}
		done <- result{fd, nil}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("dial %s as uid %d gid %d groups %v: %w", path, uid, gid, groups, r.err)
	}
	f := os.NewFile(uintptr(r.fd), path)
	defer f.Close()
	return net.FileConn(f)
}
