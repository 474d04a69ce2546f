// SPDX-License-Identifier: Apache-2.0

package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
)

// OpenParams are a session's options: the dataset, what the client expects and the loader's request.
type OpenParams struct {
	Dataset string // a registered dataset's name
	loader.Request
	// Fingerprint, when set, is the fingerprint the client expects; another is ErrConflict.
	Fingerprint string
	// JobID, when set, makes the session a rank of that job of its owner:
	// it must agree with the job's other sessions (jobs.go).
	JobID string
	// Files, when set, are the samples to read, in order: DALI's files=.
	// Only these are checked as the caller.
	Files []string
	// Webdataset datasets only: ext, missing_component_behavior, case_sensitive_extensions.
	Ext                      []string
	MissingComponentBehavior string
	CaseSensitiveExtensions  *bool
}

// Opened describes a new session.
type Opened struct {
	ID                 string
	Backend            string            // the backend that reads (the default filled in)
	BackendWhy         string            // why that backend, when the request named none (loader.Loader.BackendWhy)
	Memory             loader.MemoryDesc // the batch memory; Manager.Memory hands its descriptor over
	GPUPath            string            // for gpu memory, the path that runs: cufile or bounce
	PrefetchQueueDepth int               // in effect
	ReleaseAfter       int               // in effect
	Epoch              int               // the first batch's position:
	Iteration          int               // Iteration == EpochBatches means the end of Epoch comes first
	EpochBatches       int               // batches in Epoch for this shard
	State              loader.State      // the session's position at open, with its sampling: what a client reopens with after a daemon restart
	Fingerprint        string            // the dataset's (bmap.Map.Fingerprint)
	Content            *bmap.Content     // the dataset's content, as the caller may see it (content.go)
	Reader             string            // the dataset's DALI reader: bmap.ReaderFile or bmap.ReaderNumpy's name, or "webdataset"
	Components         int               // a webdataset session's outputs a sample, K (len(ext)): K offsets and lengths a sample; 0 otherwise
	// NotRaw: for a raw backend, the samples it reads through the filesystem, by cause.
	NotRaw []StaleCause
	// Skipped: the samples missing_component_behavior "skip" left out; SkippedLacking, per ext entry.
	Skipped        int
	SkippedLacking []int
}

// Delivery is one batch's descriptor, or the end of an epoch. Its slices
// are its own, but for Shapes' entries, which are the map's (read-only).
type Delivery struct {
	EndOfEpoch   bool
	Epoch        int
	Iteration    int
	EpochBatches int
	Slot         int
	Offsets      []int64 // of each sample in the session's memory
	Lengths      []int64
	Labels       []int32
	Indices      []int32
	Failed       []int    // positions whose sample could not be read (their lengths are 0)
	Errors       []string // one message per failed sample, naming its path and the cause
	// A numpy dataset's batch: the element type and each sample's shape; "" and nil otherwise.
	DType  string
	Shapes [][]int64
}

type session struct {
	id, dataset, backend string
	backendWhy           string   // why backend, when the open named none
	ds                   *dataset // the registration it reads (kept across reloads until it ends)
	owner                owner
	reserved             res     // batch (host and device) and sample-order memory counted against the budgets
	job                  *jobKey // the job it is a rank of; nil: none
	shard                int     // its shard_id
	l                    *loader.Loader
	slots                int
	content              *bmap.Content // its dataset's content as its owner may see it: every State carries it
	lastUsed             atomic.Int64
	// What Manager.Status tells of it, set at open: its batch memory's
	// kind and GPU, the GPU path, when it opened.
	kind, gpuPath string
	device        int
	opened        time.Time

	mu     sync.Mutex // the consumer side: one Next, State, Close or stream step at a time
	closed bool       // under mu

	// closing ends when the session is closing, so a waiting Next or stream step returns at once.
	closing     context.Context
	cancelWaits context.CancelCauseFunc

	heldMu sync.Mutex
	held   map[int]*loader.Batch // under heldMu: batches delivered and not released

	// memMu orders exports of the batch memory against its close: exports shared, close exclusive.
	// No export happens once memGone is set.
	memMu   sync.RWMutex
	memGone bool // under memMu

	streamMu   sync.Mutex
	stopStream context.CancelFunc // under streamMu: set while a stream runs

	metrics sessionMetrics
}

func newID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (ss *session) touch() { ss.lastUsed.Store(time.Now().UnixNano()) }

// newSession returns a session with its closing context; the caller
// fills in the rest.
func newSession() *session {
	ss := &session{held: map[int]*loader.Batch{}}
	ss.closing, ss.cancelWaits = context.WithCancelCause(context.Background())
	return ss
}

// interrupt ends every wait of the consumer side and its stream with why; a close does it first.
func (ss *session) interrupt(why string) {
	ss.cancelWaits(fmt.Errorf("%w: session %s was closed (%s) while this request waited for its batch", ErrNotFound, ss.id, why))
	ss.cancelStream()
}

// waitCtx returns ctx, also ended (with the session's cause) when the
// session closes; stop releases it.
func (ss *session) waitCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(ss.closing, func() { cancel(context.Cause(ss.closing)) })
	return ctx, func() { stop(); cancel(nil) }
}

// cancelStream ends the session's stream, if one runs.
func (ss *session) cancelStream() {
	ss.streamMu.Lock()
	if ss.stopStream != nil {
		ss.stopStream()
	}
	ss.streamMu.Unlock()
}

func (ss *session) streaming() bool {
	ss.streamMu.Lock()
	defer ss.streamMu.Unlock()
	return ss.stopStream != nil
}

// release gives back the batch the client holds in slot.
func (ss *session) release(slot int) error {
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	b, ok := ss.held[slot]
	if !ok {
		return fmt.Errorf("%w: slot %d holds no batch of session %s", ErrInvalid, slot, ss.id)
	}
	delete(ss.held, slot)
	b.Release()
	return nil
}

// releaseExcept gives back every batch the client holds but those in the
// slots keep.
func (ss *session) releaseExcept(keep []int) {
	ss.heldMu.Lock()
	defer ss.heldMu.Unlock()
	for slot, b := range ss.held {
		if !slices.Contains(keep, slot) {
			delete(ss.held, slot)
			b.Release()
		}
	}
}

// res is what a session reserves against the daemon's budgets.
type res struct {
	locked  int64 // page-locked batch memory (Config.MaxLockedBytes)
	device  int64 // GPU batch memory (Config.MaxDeviceBytes)
	sampler int64 // sample-order memory (Config.MaxSamplerBytes)
}

// Position names a batch: its epoch and its iteration within the epoch,
// as DALI's BatchInfo does.
type Position struct {
	Epoch, Iteration int
}
