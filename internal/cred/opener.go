package cred

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// Opener opens files as a Cred on a few threads switched to it, for code
// that runs on ordinary goroutines but must open as the caller: the kernel
// checks the open; what is read through the descriptor afterwards needs no
// further check. Safe for concurrent use; Close it when done.
type Opener struct {
	cred Cred
	reqs chan openReq
	wg   sync.WaitGroup
	once sync.Once
}

type openReq struct {
	dirfd int
	path  string
	flags int
	done  chan openRes
}

type openRes struct {
	fd  int
	err error
}

// NewOpener starts threads threads switched to c. It fails if the kernel
// refuses the switch.
func NewOpener(c Cred, threads int) (*Opener, error) {
	o := &Opener{cred: c, reqs: make(chan openReq)}
	started := make(chan error, threads)
	for range max(threads, 1) {
		o.wg.Add(1)
		go o.serve(started)
	}
	var first error
	for range max(threads, 1) {
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
		fd, err := openat(r.dirfd, r.path, r.flags)
		r.done <- openRes{fd, err}
	}
}

// Cred returns who the opener opens as.
func (o *Opener) Cred() Cred { return o.cred }

// Openat opens path relative to dirfd with flags (O_CLOEXEC is added) as
// the opener's Cred, retrying on EINTR.
func (o *Opener) Openat(dirfd int, path string, flags int) (int, error) {
	done := make(chan openRes, 1)
	o.reqs <- openReq{dirfd, path, flags, done}
	r := <-done
	return r.fd, r.err
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
