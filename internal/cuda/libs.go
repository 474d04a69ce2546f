// SPDX-License-Identifier: Apache-2.0

package cuda

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoLibraries is what a client is told when no CUDA libraries are usable.
// Where they were looked for goes to the log only.
var ErrNoLibraries = errors.New("the daemon has no usable CUDA libraries; its log says where it looked")

// Libs are one process's CUDA libraries, each loaded at most once, at first need.
// Its errors wrap ErrNoDriver, ErrNoRuntime or ErrNoLibraries and name no path.
// The full reasons go to the log, once. Libs is safe for concurrent use.
type Libs struct {
	search Search
	log    *slog.Logger

	searches atomic.Int32 // discoveries run: Searches

	rtOnce sync.Once
	rt     *Runtime
	rtErr  error // the full reason, logged
	drvErr error // the runtime's "no driver", logged

	cfOnce sync.Once
	cf     *CuFileLib
	cfErr  error // the full reason, logged

	host      CuFileHost
	drvOnce   sync.Once
	drvSettle sync.Once
	cfDone    chan struct{} // closed once cfDrvErr is settled
	cfDrvErr  error         // why cuFile's driver is unusable; nil: open
}

// LibsOption sets an option of NewLibs.
type LibsOption func(*Libs)

// WithCuFileHost sets where cuFile's host preconditions are read and how
// long its driver open may take (zero fields: DefaultCuFileHost's).
func WithCuFileHost(h CuFileHost) LibsOption {
	return func(l *Libs) { l.host = h.withDefaults() }
}

// NewLibs returns the libraries s finds; log (nil: slog.Default()) gets
// what each discovery found and every reason for what it passed over.
// cuFile's host is CuFileHostFromEnv unless WithCuFileHost says.
func NewLibs(s Search, log *slog.Logger, opts ...LibsOption) *Libs {
	if log == nil {
		log = slog.Default()
	}
	l := &Libs{search: s, log: log, host: CuFileHostFromEnv(), cfDone: make(chan struct{})}
	for _, o := range opts {
		o(l)
	}
	return l
}

// CuFileHost returns where cuFile's host preconditions are read.
func (l *Libs) CuFileHost() CuFileHost { return l.host }

// Searches returns how many discoveries ran (at most two: libcudart,
// libcufile).
func (l *Libs) Searches() int { return int(l.searches.Load()) }

// hidden is an error for a client: its message names no path, and it
// matches the sentinels of the full error it stands for.
type hidden struct {
	msg  string
	errs []error
}

func (h hidden) Error() string   { return h.msg }
func (h hidden) Unwrap() []error { return h.errs }

// hide returns the client's version of full: ErrNoLibraries, and those of
// ErrNoDriver and ErrNoRuntime that full matches.
func hide(full error) error {
	errs := []error{ErrNoLibraries}
	for _, s := range []error{ErrNoDriver, ErrNoRuntime} {
		if errors.Is(full, s) {
			errs = append(errs, s)
		}
	}
	return hidden{msg: "cuda: " + ErrNoLibraries.Error(), errs: errs}
}

// places lists the directories of the search and how each was chosen,
// for the log.
func (l *Libs) places() string {
	var p []string
	for _, pl := range l.search.Places() {
		p = append(p, pl.Dir+" ("+pl.From+")")
	}
	if !l.search.NoLoaderSearch {
		p = append(p, FromLoader)
	}
	return strings.Join(p, "; ")
}

// OpenRuntime returns libcudart, found and loaded at the first call,
// whether or not a driver is present.
func (l *Libs) OpenRuntime() (*Runtime, error) {
	l.rtOnce.Do(func() {
		l.searches.Add(1)
		l.rt, l.rtErr = OpenRuntime(l.search)
		if l.rtErr != nil {
			l.log.Warn("cuda: no usable libcudart: memory gpu is refused", "searched", l.places(), "why", l.rtErr)
			return
		}
		attrs := foundAttrs("libcudart", l.rt.Found)
		if _, l.drvErr = l.rt.DriverVersion(); l.drvErr != nil {
			attrs = append(attrs, "driver", l.drvErr)
		}
		l.log.Info("cuda: libcudart loaded", attrs...)
	})
	if l.rtErr != nil {
		return nil, hide(l.rtErr)
	}
	return l.rt, nil
}

// Library returns the file of the CUDA library name, "cudart" or
// "cufile", loaded at the first ask. It makes Libs a backend.Driver.
func (l *Libs) Library(name string) (string, error) {
	switch name {
	case "cudart":
		rt, err := l.OpenRuntime()
		if err != nil {
			return "", err
		}
		return rt.Path, nil
	case "cufile":
		cf, err := l.CuFile()
		if err != nil {
			return "", err
		}
		return cf.Path, nil
	}
	return "", fmt.Errorf("cuda: no library %q (want cudart or cufile)", name)
}

// Load returns libcudart as OpenRuntime does, or ErrNoDriver where the
// runtime finds no driver.
func (l *Libs) Load() (*Runtime, error) {
	rt, err := l.OpenRuntime()
	if err != nil {
		return nil, err
	}
	if l.drvErr != nil {
		return nil, hidden{msg: "cuda: " + ErrNoDriver.Error() + " (the CUDA runtime loaded says so; the daemon's log names it)", errs: []error{ErrNoDriver}}
	}
	return rt, nil
}

// CuFile returns libcufile, found and loaded at the first call.
func (l *Libs) CuFile() (*CuFileLib, error) {
	l.cfOnce.Do(func() {
		l.searches.Add(1)
		l.cf, l.cfErr = LoadCuFileFrom(l.search)
		if l.cfErr != nil {
			l.log.Warn("cuda: no usable libcufile: gpu_path cufile is unavailable", "searched", l.places(), "why", l.cfErr)
			return
		}
		l.log.Info("cuda: libcufile loaded", foundAttrs("libcufile", l.cf.Found)...)
	})
	if l.cfErr != nil {
		return nil, hidden{msg: "cuda: no usable libcufile; the daemon's log says where it looked", errs: []error{ErrNoLibraries}}
	}
	return l.cf, nil
}

// CuFileDriver returns libcufile with its driver open, once per process, as KvikIO does.
// The kernel must list cuFile's modules first, or the open never returns.
// The open runs on its own thread, bounded by OpenTimeout; past it cuFile is unusable.
// Every later call returns the first one's verdict at once.
func (l *Libs) CuFileDriver() (*CuFileLib, error) {
	lib, err := l.CuFile()
	if err != nil {
		return nil, err
	}
	l.drvOnce.Do(func() { l.openDriver(lib) })
	<-l.cfDone
	if l.cfDrvErr != nil {
		return nil, l.cfDrvErr
	}
	return lib, nil
}

// settleDriver records the driver's verdict, once.
func (l *Libs) settleDriver(err error) bool {
	settled := false
	l.drvSettle.Do(func() {
		l.cfDrvErr, settled = err, true
		close(l.cfDone)
	})
	return settled
}

// openDriver checks the preconditions and starts the bounded open.
func (l *Libs) openDriver(lib *CuFileLib) {
	nvfs, err := l.host.CheckModules()
	if err != nil {
		l.log.Warn("cuda: cuFile is unusable", "why", err)
		l.settleDriver(err)
		return
	}
	timeout := l.host.OpenTimeout
	go func() {
		// Locked and never unlocked: a stuck open keeps its thread, and a
		// finished one ends it with the goroutine.
		runtime.LockOSThread()
		start := time.Now()
		err := lib.Open()
		var fe *FileError
		if errors.As(err, &fe) && fe.Code == FileDriverAlreadyOpen {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("cuda: cuFile's driver: %w", err)
		}
		if l.settleDriver(err) {
			l.log.Info("cuda: cuFile driver opened", "nvidia_fs", nvfs, "took", time.Since(start).Round(time.Millisecond), "err", err)
			return
		}
		l.log.Warn("cuda: cuFileDriverOpen returned after its deadline: cuFile stays unusable for this process", "took", time.Since(start).Round(time.Millisecond), "err", err)
	}()
	go func() {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-l.cfDone:
		case <-t.C:
			err := fmt.Errorf("cuda: %w within %v: cuFile is unusable until the daemon restarts (its thread is abandoned); libcufile's log (cufile.log) may say why", ErrCuFileDriverStuck, timeout)
			if l.settleDriver(err) {
				l.log.Error("cuda: cuFile is unusable", "why", err)
			}
		}
	}()
}

// foundAttrs are the log attributes saying where library name was found
// and what was passed over on the way.
func foundAttrs(name string, f Found) []any {
	attrs := []any{name, f.File(), "found_by", f.From}
	if len(f.Refused) > 0 {
		attrs = append(attrs, "refused", strings.Join(f.Refused, "; "))
	}
	return attrs
}
