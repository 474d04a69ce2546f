// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"fmt"
	"runtime"

	"github.com/nvfeed/nvfeed/internal/numa"
)

// Thread runs functions on one locked OS thread whose current device is
// set. CUDA binds a context to a thread. A goroutine that moved between
// threads would lose it: driver error 201, or cuFile 5015 or 5047. Every
// CUDA and cuFile call of a device's memory goes through its Thread.
type Thread struct {
	Runtime *Runtime
	Device  int
	work    chan func()
	done    chan struct{}
}

// NewThread starts a locked thread with device current.
func (r *Runtime) NewThread(device int) (*Thread, error) {
	t := &Thread{Runtime: r, Device: device, work: make(chan func()), done: make(chan struct{})}
	started := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		defer close(t.done)
		if err := r.SetDevice(device); err != nil {
			started <- fmt.Errorf("cuda: device %d: %w", device, err)
			return
		}
		started <- nil
		for fn := range t.work {
			fn()
		}
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return t, nil
}

// Do runs fn on the thread and returns its error.
func (t *Thread) Do(fn func() error) error {
	errc := make(chan error, 1)
	t.work <- func() { errc <- fn() }
	return <-errc
}

// Pin restricts the thread to cpus (the GPU's NUMA node).
func (t *Thread) Pin(cpus []int) error {
	return t.Do(func() error { return numa.PinThread(cpus) })
}

// Close ends the thread once the functions queued have run. Do must not
// be called after.
func (t *Thread) Close() {
	close(t.work)
	<-t.done
}
