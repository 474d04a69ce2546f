package serve

import (
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// The HTTP API. Bodies are msgpack with explicit snake_case keys; unknown
// keys are refused. Errors are {"error": "..."} with a 4xx or 5xx status.
//
//	GET    /v1/backends               -            -> BackendsResponse
//	GET    /v1/datasets               -            -> DatasetsResponse (counts only: no session, no file)
//	POST   /v1/reload                 -            -> ReloadResponse (uid 0 on the unix socket only)
//	POST   /v1/sessions               OpenRequest  -> OpenResponse
//	POST   /v1/sessions/{id}/next     NextRequest  -> NextResponse (blocks until a batch is read; body optional)
//	POST   /v1/sessions/{id}/release  ReleaseRequest
//	POST   /v1/sessions/{id}/memory   with "Upgrade: nvfeed-memory" -> 101, then one MemoryResponse frame carrying the memory's file descriptor (see MemoryUpgrade)
//	POST   /v1/sessions/{id}/stream   StreamRequest, with "Upgrade: nvfeed-stream" -> 101, then frames (see StreamRequest)
//	GET    /v1/sessions/{id}/state    -            -> loader.State
//	DELETE /v1/sessions/{id}
//	GET    /metrics (Prometheus text), GET /healthz

// OpenRequest opens a session: a loader over a registered dataset. Its
// keys: dataset, DALI's reader arguments (batch_size, shard_id,
// num_shards, random_shuffle, seed, pad_last_batch, stick_to_shard),
// backend, backend_options, prefetch_queue_depth, release_after, memory
// ("pinned" or "gpu"), device_id, state.
type OpenRequest = session.OpenParams

// OpenResponse describes the new session, its batch memory (kind, size,
// slot size, device; the memory itself comes as a file descriptor from
// POST /v1/sessions/{id}/memory) and the position of its first batch.
type OpenResponse = session.Opened

// MemoryUpgrade is the Upgrade header value that asks for a session's
// batch memory. Only the session's owner gets it, and only on the unix
// socket. The daemon answers 101, then sends one frame (a 4-byte
// big-endian length and that much msgpack: a MemoryResponse) whose bytes
// carry the memory's file descriptor as SCM_RIGHTS ancillary data, and
// closes the connection. The client maps the descriptor (read-only, shared,
// Size bytes) and closes it; the mapping stays valid after the session and
// the daemon are gone. Over TCP no descriptor can be passed: sessions open
// and deliver descriptors, but their batch bytes cannot be reached.
const MemoryUpgrade = "nvfeed-memory"

// MemoryResponse is the frame that carries a session's memory descriptor.
type MemoryResponse struct {
	Memory batchmem.Desc `msgpack:"memory"`
}

// NextResponse is one batch's descriptor, or the end of an epoch.
type NextResponse struct {
	EndOfEpoch   bool     `msgpack:"end_of_epoch"`
	Epoch        int      `msgpack:"epoch"`
	Iteration    int      `msgpack:"iteration"`
	EpochBatches int      `msgpack:"epoch_batches"`
	Slot         int      `msgpack:"slot"`
	Offsets      []int64  `msgpack:"offsets"` // of each sample in the shared memory
	Lengths      []int64  `msgpack:"lengths"`
	Labels       []int32  `msgpack:"labels"`
	Indices      []int32  `msgpack:"indices"`
	Failed       []int    `msgpack:"failed,omitempty"` // positions whose sample could not be read (length 0)
	Errors       []string `msgpack:"errors,omitempty"` // one message per failed sample: its path and the cause
	// In a stream only: the stream ended with this error (the last frame),
	// and the HTTP status a request would have had for it (404: the
	// session is gone, e.g. the daemon stopped).
	Error       string `msgpack:"error,omitempty"`
	ErrorStatus int    `msgpack:"error_status,omitempty"`
	// In a stream only: the answer to a stop; the releases are done (the last frame).
	Stopped bool `msgpack:"stopped,omitempty"`
}

// StreamUpgrade is the Upgrade header value that starts a stream.
const StreamUpgrade = "nvfeed-stream"

// StreamRequest starts a stream, optionally at a position (epoch and
// iteration, both or neither).
//
// A stream carries frames both ways on the upgraded connection: each is a
// 4-byte big-endian length and that many bytes of msgpack. The daemon
// sends a NextResponse per batch (or end of epoch) as soon as it is read,
// bounded by the session's slots. The client sends StreamControl frames:
// releases (no reply: no round trip per batch), or a stop naming the slots
// it still holds, answered by a frame with stopped set once every other
// delivered batch is released. When the connection closes without a stop
// (the client died, or its connection broke while it may still be using
// the batches), every delivered batch stays held: the next stream's keep
// says which of them the client still holds, and every other one is
// released before its first frame; an abandoned session's batches go with
// the session (closed or reaped).
type StreamRequest struct {
	Epoch     *int  `msgpack:"epoch"`
	Iteration *int  `msgpack:"iteration"`
	Keep      []int `msgpack:"keep"` // slots of delivered batches the client still holds
}

// StreamControl is a frame from the client in a stream.
type StreamControl struct {
	Release []int `msgpack:"release"` // slots given back
	Stop    bool  `msgpack:"stop"`    // end the stream...
	Keep    []int `msgpack:"keep"`    // ...keeping these slots held
}

// NextRequest may carry slots to release first, saving a round trip, and
// may name the batch wanted (epoch and iteration, both or neither: DALI's
// BatchInfo); without them the session's next batch comes.
type NextRequest struct {
	Release   []int `msgpack:"release"`
	Epoch     *int  `msgpack:"epoch"`
	Iteration *int  `msgpack:"iteration"`
}

// ReleaseRequest gives a batch's slot back.
type ReleaseRequest struct {
	Slot int `msgpack:"slot"`
}

// BackendsResponse is what this daemon offers.
type BackendsResponse struct {
	Default            string         `msgpack:"default"`              // the backend used when none is named
	PrefetchQueueDepth int            `msgpack:"prefetch_queue_depth"` // its default
	Backends           []backend.Spec `msgpack:"backends"`             // each with its options, defaults and limits
}

// DatasetsResponse describes every registered dataset, sorted by name.
type DatasetsResponse struct {
	Datasets []DatasetInfo `msgpack:"datasets"`
}

// DatasetInfo is one registered dataset: its name, size, and how many of
// its samples are fresh, stale, filesystem-only, and how many files were
// added to its folders since mapping (session.DatasetInfo).
type DatasetInfo = session.DatasetInfo

// ReloadResponse says what a reload did with each dataset, sorted by name.
type ReloadResponse struct {
	Datasets []Reloaded `msgpack:"datasets"`
}

// Reloaded is one dataset's outcome of a reload (session.Reloaded).
type Reloaded = session.Reloaded

// ErrorResponse is the body of every error status.
type ErrorResponse struct {
	Error string `msgpack:"error"`
}
