// SPDX-License-Identifier: Apache-2.0

// Package cred lets the daemon do filesystem work as another user.
// The work runs on a locked OS thread with that user's fs uid, fs gid and groups.
// So the kernel judges every open as the user's own; root's overrides do not apply.
// Credentials are per thread, so raw system calls change only the calling thread.
// A switched thread is never handed back: its goroutine exits locked.
package cred

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cred is who the kernel judges: a filesystem uid, a filesystem gid and
// the supplementary groups, as a unix socket's peer had them when it
// connected (SO_PEERCRED, SO_PEERGROUPS).
type Cred struct {
	UID, GID uint32
	Groups   []uint32
}

// String names the credentials for messages: "uid 1000 gid 1000 groups [4 27]".
func (c Cred) String() string {
	return fmt.Sprintf("uid %d gid %d groups %v", c.UID, c.GID, c.Groups)
}

// ErrSwitch is wrapped by the errors of a switch of credentials that the
// kernel refused or did not apply.
var ErrSwitch = errors.New("cred: cannot switch the thread's credentials")

// maxGroups is the kernel's NGROUPS_MAX.
const maxGroups = 65536

// Peer returns the credentials of unix socket fd's peer as the kernel took them at connect.
func Peer(fd int) (Cred, error) {
	uc, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return Cred{}, fmt.Errorf("cred: SO_PEERCRED: %w", err)
	}
	c := Cred{UID: uc.Uid, GID: uc.Gid}
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case e == 0:
			c.Groups = append([]uint32(nil), buf[:n/4]...)
			return c, nil
		case e == unix.ERANGE && int(n/4) > len(buf) && int(n/4) <= maxGroups:
			buf = make([]uint32, n/4)
		default:
			return Cred{}, fmt.Errorf("cred: SO_PEERGROUPS: %w", e)
		}
	}
}

// Become switches the calling thread to c: groups, then fs gid, then fs uid, each checked.
// The goroutine must have locked its OS thread and must end locked, so the thread ends too.
func (c Cred) Become() error {
	if len(c.Groups) > maxGroups {
		return fmt.Errorf("%w: %d supplementary groups, the kernel allows %d", ErrSwitch, len(c.Groups), maxGroups)
	}
	var p unsafe.Pointer
	if len(c.Groups) > 0 {
		p = unsafe.Pointer(&c.Groups[0])
	}
	// Raw system calls: only this thread (glibc and Go's syscall.Setgroups
	// broadcast to every thread of the process).
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(c.Groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("%w: setgroups %v: %w", ErrSwitch, c.Groups, e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(c.GID), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(c.UID), 0, 0)
	// setfsuid/setfsgid return the previous value and no error; an invalid
	// id (-1) changes nothing and returns the current one.
	fsgid, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0)
	fsuid, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0)
	if uint32(fsuid) != c.UID || uint32(fsgid) != c.GID {
		return fmt.Errorf("%w: asked for fsuid %d fsgid %d, the thread has %d %d", ErrSwitch, c.UID, c.GID, uint32(fsuid), uint32(fsgid))
	}
	return nil
}

// Do runs fn on a new OS thread switched to c and returns fn's error (or
// the switch's). The thread ends with the call.
func (c Cred) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if err := c.Become(); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}
