package loader

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nvfeed/nvfeed/bmap"
)

// Request is one sample to read into batch memory.
type Request struct {
	Index  int          // sample index in the map
	Sample *bmap.Sample // the sample
	Buf    []byte       // Align-aligned, alignUp(Size) bytes; the sample goes to Buf[:Size]
	Err    error        // set by the backend when this sample failed
}

// Backend reads samples into memory. ReadBatch may be called from several
// goroutines at once (one per batch in flight); implementations share one
// pool of I/O workers or queues among them.
type Backend interface {
	// Name is the backend's name, e.g. "file".
	Name() string
	// ReadBatch reads every request and returns when all are done (or
	// abandoned after ctx is cancelled). The error, if any, names the
	// first failed sample; the other requests' bytes are complete.
	ReadBatch(ctx context.Context, reqs []Request) error
	// Info describes how the backend runs, for reports.
	Info() map[string]any
	// Close stops the backend's workers.
	Close() error
}

// ErrShortRead is returned (wrapped) when a sample has fewer or more bytes
// than the map says: the file changed since it was mapped.
var ErrShortRead = errors.New("file size differs from the map")

// SampleError is a failed read of one sample.
type SampleError struct {
	Index int    // sample index
	Path  string // sample path, relative to the root
	Err   error  // the cause
}

// Error names the sample and the cause.
func (e *SampleError) Error() string {
	return fmt.Sprintf("sample %d (%s): %v", e.Index, e.Path, e.Err)
}

// Unwrap returns the cause.
func (e *SampleError) Unwrap() error { return e.Err }

// batchWait collects the completion of one batch's requests.
type batchWait struct {
	wg   sync.WaitGroup
	once sync.Once
	err  error
}

func (w *batchWait) fail(err error) { w.once.Do(func() { w.err = err }) }
