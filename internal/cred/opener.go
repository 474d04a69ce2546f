// SPDX-License-Identifier: Apache-2.0

package cred

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Opener opens files as a Cred, on a few threads switched to it. It is for
// code that runs on ordinary goroutines but must open as the caller. The
// kernel checks the open. What is read through the descriptor afterwards
// needs no further check. An Opener is safe for concurrent use. Close it
// when done.
type Opener struct {
	cred    Cred
	threads int
	reqs    chan openReq
	wg      sync.WaitGroup
	once    sync.Once
}

type openReq struct {
	dirfd int
	paths []string
	flags int
	fds   []int   // len(paths): set by the thread
	errs  []error // len(paths): set by the thread
	done  chan struct{}
}

// NewOpener starts threads threads switched to c. It fails if the kernel
// refuses the switch.
func NewOpener(c Cred, threads int) (*Opener, error) {
	threads = max(threads, 1)
	o := &Opener{cred: c, threads: threads, reqs: make(chan openReq)}
	started := make(chan error, threads)
	for range threads {
		o.wg.Add(1)
		go o.serve(started)
	}
	var first error
	for range threads {
		if err := <-started; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		o.Close()
		return nil, first
	}
	return o, nil
}

func (o *Opener) serve(started chan<- error) {
	defer o.wg.Done()
	runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
	err := o.cred.Become()
	started <- err
	if err != nil {
		return
	}
	for r := range o.reqs {
		for i, p := range r.paths {
			r.fds[i], r.errs[i] = openat(r.dirfd, p, r.flags)
		}
		r.done <- struct{}{}
	}
}

// Cred returns who the opener opens as.
func (o *Opener) Cred() Cred { return o.cred }

// Openat opens path relative to dirfd with flags (O_CLOEXEC is added) as
// the opener's Cred, retrying on EINTR.
func (o *Opener) Openat(dirfd int, path string, flags int) (int, error) {
	fds, errs := o.OpenatAll(dirfd, []string{path}, flags)
	return fds[0], errs[0]
}

// OpenatAll is Openat of every path, shared among the opener's threads.
// Each thread gets its share in one hand-off. A thread switched to another
// user's credentials is locked, so handing it one file at a time costs more
// than the open. fds[i] is -1 where errs[i] is set.
func (o *Opener) OpenatAll(dirfd int, paths []string, flags int) (fds []int, errs []error) {
	fds, errs = make([]int, len(paths)), make([]error, len(paths))
	chunk := max((len(paths)+o.threads-1)/o.threads, 1)
	done := make(chan struct{}, o.threads)
	n := 0
	for lo := 0; lo < len(paths); lo += chunk {
		hi := min(lo+chunk, len(paths))
		o.reqs <- openReq{dirfd: dirfd, paths: paths[lo:hi], flags: flags, fds: fds[lo:hi], errs: errs[lo:hi], done: done}
		n++
	}
	for range n {
		<-done
	}
	return fds, errs
}

// Close stops the opener's threads. No Openat may be running or follow.
func (o *Opener) Close() {
	o.once.Do(func() { close(o.reqs) })
	o.wg.Wait()
}

func openat(dirfd int, path string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, path, flags|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}
