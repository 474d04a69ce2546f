// SPDX-License-Identifier: Apache-2.0

// Package wire is loaderd's protocol on the wire, in one place: every
// request, response and stream frame as a Go struct with its msgpack keys
// and the ranges its numbers must be in, the upgrade names, the frame
// format, and the decoding every message from a client goes through
// (Decode, DecodeControl, ReadFrame: checked before anything is
// allocated). Package serve converts these to and from the session
// core's plain Go types (serve/convert.go); the Python client's TypedDicts
// (python/nvfeed/_wire.py) mirror them key by key, which this
// package's test checks both ways. The open request's loader fields are
// loader.Request's (tagged there, as loader.State's are).
//
// The HTTP API. Bodies are msgpack with explicit snake_case keys; unknown
// keys are refused. Errors are {"error": "...", "code": "..."} with a 4xx or
// 5xx status (code: one of the Code constants, for a client to branch on).
//
//	GET    /v1/backends               -            -> BackendsResponse
//	GET    /v1/datasets               -            -> DatasetsResponse (counts only: no session, no file)
//	GET    /v1/status                 -            -> StatusResponse (sessions: root sees all, others their own)
//	POST   /v1/reload                 -            -> ReloadResponse (uid 0 on the unix socket only)
//	POST   /v1/sessions               OpenRequest  -> OpenResponse
//	POST   /v1/sessions/{id}/next     NextRequest  -> NextResponse (blocks until a batch is read; body optional)
//	POST   /v1/sessions/{id}/release  ReleaseRequest
//	POST   /v1/sessions/{id}/memory   with "Upgrade: nvfeed-memory" -> 101, then one MemoryResponse frame carrying the memory's file descriptor (see MemoryUpgrade)
//	POST   /v1/sessions/{id}/stream   StreamRequest, with "Upgrade: nvfeed-stream" -> 101, then frames (see StreamRequest)
//	GET    /v1/sessions/{id}/state    -            -> loader.State
//	DELETE /v1/sessions/{id}
//	GET    /metrics (Prometheus text), GET /healthz
//
// The read-only GETs (backends, datasets, status, a session's state,
// healthz) answer JSON instead, the same keys, to a request with
// "Accept: application/json"; msgpack is the default.
//
// Ranges: a slot is in [0, 129) (session.MaxSlots: prefetch 64 + release
// after 64 + 1) and a list of slots has at most 129 entries; an epoch and
// an iteration are in [0, 2^31-1] (loader.MaxEpoch, loader.MaxIteration);
// batch_size is in [1, 65536] (loader.MaxBatchSize); num_shards is in
// [1, 2^31-1] (0 is refused: it does not mean 1); prefetch_queue_depth,
// when given, in [1, 64]; job_id has at most 128 bytes
// (session.MaxJobID), fingerprint is "" or 32 hex digits. A number or
// string out of its range is answered 400 and names the field, its value
// and the range. docs/protocol.md has the whole table.
package wire

import (
	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// OpenRequest opens a session: a loader over a registered dataset. Its
// loader fields are loader.Request's, keys and all (one struct for the
// wire, the session core and the loader's plan):
//
//   - DALI's reader arguments: batch_size in [1, 65536], shard_id in
//     [0, num_shards), num_shards in [1, 2^31-1], random_shuffle, seed,
//     pad_last_batch, stick_to_shard, initial_fill in [1, 2^24] (0 means
//     1024); and shuffle, how random_shuffle shuffles: "permute" ("" too)
//     or "dali" (see loader.ReaderArgs); shuffle_after_epoch (not with
//     random_shuffle or stick_to_shard);
//   - backend: a name from GET /v1/backends ("" means the default), and
//     backend_options, the backend's options by name (at most 64 entries);
//   - prefetch_queue_depth in [1, 64] (absent: loader.DefaultPrefetchQueueDepth),
//     release_after in [0, 64] (the client releases a batch after this
//     many later ones; absent: prefetch_queue_depth+1);
//   - memory: "pinned" ("" too) or "gpu"; device_id in [0, 1023], the
//     daemon's ordinal, used only when device_uuid is ""; device_uuid
//     (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, cuDeviceGetUuid's bytes;
//     at most 64 characters): the daemon uses its own ordinal for it (the
//     client's and the daemon's CUDA_VISIBLE_DEVICES may differ), a GPU the
//     daemon does not see is answered 400 naming it and the GPUs it sees;
//     gpu_path: "cufile", "bounce" or "auto" ("" too), memory gpu only;
//   - state: resume here, a state an open response or GET .../state gave.
type OpenRequest struct {
	Dataset        string `msgpack:"dataset"` // a registered dataset's name
	loader.Request `msgpack:",inline"`
	// Fingerprint: "" or the dataset's fingerprint the client expects (an
	// open response's, or GET /v1/datasets'): another one is refused (409).
	Fingerprint string `msgpack:"fingerprint"`
	// JobID: "" or the job this session is a rank of, at most 128 bytes of
	// UTF-8 without control characters. The sessions of one job (one
	// owner's, on this daemon) must read one dataset with the same
	// sampling, each its own shard_id; one that does not is refused (409,
	// code CodeRankMismatch, "ranks disagree: ...", naming each difference).
	JobID string `msgpack:"job_id"`
	// Files: DALI's files= (file_list's names too): the samples of the
	// dataset this session reads, in this order, each named by its path
	// relative to the map's root or by its absolute path under it; nil or
	// empty: the whole dataset. At most session.MaxFiles names; a name
	// not in the map is refused (400, naming it), and only the named
	// files are checked as the caller.
	Files []string `msgpack:"files,omitempty"`
	// WebDataset datasets only (reader "webdataset"), where they are
	// required; given for another dataset: 400. Ext: one entry per
	// output, each a ';'-separated list of extensions any of which fills
	// it, as fn.readers.webdataset's ext (1 to 64 entries, each at most
	// 256 bytes). MissingComponentBehavior: "skip", "empty" or "error"
	// (case insensitive; "" means "empty"), what a sample with fewer
	// matching components than outputs becomes. CaseSensitiveExtensions:
	// absent means true (DALI's default).
	Ext                      []string `msgpack:"ext"`
	MissingComponentBehavior string   `msgpack:"missing_component_behavior"`
	CaseSensitiveExtensions  *bool    `msgpack:"case_sensitive_extensions"`
}

// OpenResponse describes the new session, its batch memory (kind, size,
// slot size, device; the memory itself comes as a file descriptor from
// POST /v1/sessions/{id}/memory) and the position of its first batch.
type OpenResponse struct {
	ID                 string        `msgpack:"id"`
	Backend            string        `msgpack:"backend"`              // the backend that reads (the default filled in)
	BackendWhy         string        `msgpack:"backend_why"`          // why that backend when the request named none: raw reads where the map allows, else the filesystem; "" when named
	Memory             batchmem.Desc `msgpack:"memory"`               // the batch memory; its descriptor comes from POST .../memory
	GPUPath            string        `msgpack:"gpu_path"`             // for gpu memory, the path that runs: cufile or bounce
	PrefetchQueueDepth int           `msgpack:"prefetch_queue_depth"` // in effect
	ReleaseAfter       int           `msgpack:"release_after"`        // in effect
	Epoch              int           `msgpack:"epoch"`                // the first batch's position:
	Iteration          int           `msgpack:"iteration"`            // Iteration == EpochBatches means the end of Epoch comes first
	EpochBatches       int           `msgpack:"epoch_batches"`        // batches in Epoch for this shard
	State              loader.State  `msgpack:"state"`                // the session's position at open, with its sampling: what a client reopens with after a daemon restart
	Fingerprint        string        `msgpack:"fingerprint"`          // the dataset's: what ranks compare, and what a reopen asks for
	// Content summarises the dataset by its samples' names, sizes and
	// labels (bmap.Content): ranks on other nodes compare it to name a
	// difference. Absent from a daemon without feature "content".
	Content *bmap.Content `msgpack:"content,omitempty"`
	// Reader is the DALI reader whose samples the dataset holds: "file"
	// (encoded files with labels), "numpy" (.npy arrays: batches carry
	// dtype and shapes) or "webdataset" (tar members: K outputs a sample).
	Reader string `msgpack:"reader"`
	// Components is K, the outputs of a sample (len(ext)) of a
	// "webdataset" dataset, whose batches list K (offset, length) pairs
	// per sample (NextResponse); 0 for "file" and "numpy" datasets.
	Components int `msgpack:"components"`
	// NotRaw is, for a backend that reads raw (gds, bam), the dataset's
	// raw-mapped samples it reads through the filesystem instead, by
	// cause, with the fix (as loaderd status says); absent when none.
	NotRaw []StaleCause `msgpack:"not_raw,omitempty"`
	// Skipped is, for a "webdataset" session with
	// missing_component_behavior "skip", the samples of the dataset left
	// out, and SkippedLacking, per ext entry, how many of them lack it
	// (why they were left out); absent when none. Every epoch leaves the
	// same ones out: a client says so once an epoch.
	Skipped        int   `msgpack:"skipped,omitempty"`
	SkippedLacking []int `msgpack:"skipped_lacking,omitempty"`
}

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
	EndOfEpoch   bool `msgpack:"end_of_epoch"`
	Epoch        int  `msgpack:"epoch"`
	Iteration    int  `msgpack:"iteration"`
	EpochBatches int  `msgpack:"epoch_batches"`
	Slot         int  `msgpack:"slot"`
	// Offsets and Lengths: of each sample in the shared memory; of a
	// webdataset dataset (OpenResponse.Components K > 0), K entries per
	// sample, sample-major (sample i's output k at i·K+k), each output a
	// room of its own, 4 KiB-aligned as a sample's; length 0: an empty
	// output (missing_component_behavior "empty"), or a failed sample.
	Offsets []int64  `msgpack:"offsets"`
	Lengths []int64  `msgpack:"lengths"`
	Labels  []int32  `msgpack:"labels"` // one per sample; empty for a webdataset dataset
	Indices []int32  `msgpack:"indices"`
	Failed  []int    `msgpack:"failed,omitempty"` // positions whose sample could not be read (length 0)
	Errors  []string `msgpack:"errors,omitempty"` // one message per failed sample: its path and the cause
	// Numpy datasets only: the samples' element type as an .npy header's
	// descr writes it ("<f4", "|u1", "|b1", "<i8", ...: one for the
	// dataset), and each sample's shape in batch order (outermost first;
	// [] for a 0-d array), a failed sample's as mapped. Each sample's
	// bytes are a C-order array of that shape; its length is the shape's
	// product times the element size (0 for a failed sample). Labels are
	// zeros.
	DType  string    `msgpack:"dtype,omitempty"`
	Shapes [][]int64 `msgpack:"shapes,omitempty"`
	// In a stream only: the stream ended with this error (the last frame),
	// and the HTTP status a request would have had for it (404: the
	// session is gone, e.g. the daemon stopped).
	Error       string `msgpack:"error,omitempty"`
	ErrorStatus int    `msgpack:"error_status,omitempty"`
	ErrorCode   string `msgpack:"error_code,omitempty"` // as ErrorResponse.Code

	// In a stream only: the answer to a stop; the releases are done (the last frame).
	Stopped bool `msgpack:"stopped,omitempty"`
}

// StreamUpgrade is the Upgrade header value that starts a stream.
const StreamUpgrade = "nvfeed-stream"

// StreamRequest starts a stream, optionally at a position (epoch and
// iteration, both or neither).
//
// A stream carries frames both ways on the upgraded connection: each is a
// 4-byte big-endian length and that many bytes of msgpack (at most
// MaxFrame from the client). The daemon sends a NextResponse per batch
// (or end of epoch) as soon as it is read, bounded by the session's
// slots. The client sends StreamControl frames: releases (no reply: no
// round trip per batch), or a stop naming the slots it still holds,
// answered by a frame with stopped set once every other delivered batch
// is released. When the connection closes without a stop (the client
// died, or its connection broke while it may still be using the
// batches), every delivered batch stays held: the next stream's keep says
// which of them the client still holds, and every other one is released
// before its first frame; an abandoned session's batches go with the
// session (closed or reaped).
type StreamRequest struct {
	Epoch     *int  `msgpack:"epoch"`     // in [0, 2^31-1]
	Iteration *int  `msgpack:"iteration"` // in [0, 2^31-1]
	Keep      []int `msgpack:"keep"`      // slots of delivered batches the client still holds
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
	Epoch     *int  `msgpack:"epoch"`     // in [0, 2^31-1]
	Iteration *int  `msgpack:"iteration"` // in [0, 2^31-1]
}

// ReleaseRequest gives a batch's slot back.
type ReleaseRequest struct {
	Slot int `msgpack:"slot"`
}

// BackendsResponse is what this daemon offers.
type BackendsResponse struct {
	Default            string         `msgpack:"default"`              // the backend used when none is named and the dataset allows no raw reads
	Auto               string         `msgpack:"auto"`                 // the backend used when none is named over a dataset that allows raw reads (OpenResponse.BackendWhy says which a session got)
	PrefetchQueueDepth int            `msgpack:"prefetch_queue_depth"` // its default
	Backends           []backend.Spec `msgpack:"backends"`             // each with its options, defaults and limits
}

// DatasetsResponse describes every registered dataset, sorted by name.
type DatasetsResponse struct {
	Datasets []DatasetInfo `msgpack:"datasets"`
}

// DatasetInfo is one registered dataset: its name, size, and how many of
// its samples are fresh, stale, filesystem-only, and how many files were
// added to its folders since mapping. It names no file: counts only, and
// those only to a caller who may read the dataset (readable); added only
// to one who may also list every folder it counts in. Root sees all.
type DatasetInfo struct {
	Name string `msgpack:"name"`
	// Readable: the caller may read every sample of the dataset; false:
	// only name, reader and freshness are given.
	Readable bool   `msgpack:"readable"`
	Samples  *int   `msgpack:"samples,omitempty"` // in the map: what sessions serve
	Bytes    *int64 `msgpack:"bytes,omitempty"`   // the samples' sizes when mapped, summed
	Classes  *int   `msgpack:"classes,omitempty"`
	// Fresh raw samples are still readable from their extents; Stale ones
	// changed since mapping and are read through the filesystem, or fail
	// if gone; FilesystemOnly ones were mapped without extents. Without a
	// guard (freshness unchecked) every raw sample counts as stale.
	Fresh *int `msgpack:"fresh,omitempty"`
	Stale *int `msgpack:"stale,omitempty"`
	// Writable raw-mapped samples are unchanged but a user the daemon
	// does not trust may change them (owner, mode, ACL, not immutable):
	// read through the filesystem as the caller, never raw.
	Writable       *int `msgpack:"writable,omitempty"`
	FilesystemOnly *int `msgpack:"filesystem_only,omitempty"`
	// Pending raw-mapped samples are not judged yet by the checking pass
	// that runs after the daemon's start: read through the filesystem as
	// the caller until it has.
	Pending *int `msgpack:"pending,omitempty"`
	// Added counts files in the dataset's folders that DALI's
	// fn.readers.file would list and the map does not have; -1: the
	// folders could not be listed; absent: the caller may not list them.
	Added       *int   `msgpack:"added,omitempty"`
	Freshness   string `msgpack:"freshness"`             // watch, read, none or unchecked
	Fingerprint string `msgpack:"fingerprint,omitempty"` // the same on every node holding a copy: its samples' paths, labels and sizes
	Reader      string `msgpack:"reader"`                // "file", "numpy" or "webdataset": the DALI reader whose samples these are
	DType       string `msgpack:"dtype"`                 // numpy: the arrays' element type as an .npy descr ("<f4"); "" for file datasets
}

// StatusResponse is what the daemon serves and holds, as the caller may
// see it (loaderd status): the datasets as DatasetsResponse gives them,
// with why raw-mapped samples are read through the filesystem; the open
// sessions (root on the unix socket: every one; another caller: its
// own), never their ids; the daemon's budgets and how much of each is
// used.
type StatusResponse struct {
	Datasets []DatasetStatus `msgpack:"datasets"`
	Sessions []SessionInfo   `msgpack:"sessions"`
	Budgets  []Budget        `msgpack:"budgets"`
}

// DatasetStatus is a DatasetInfo with, for a caller who may read the
// dataset, why its raw-mapped samples not read raw are not.
type DatasetStatus struct {
	DatasetInfo `msgpack:",inline"`
	StaleCauses []StaleCause `msgpack:"stale_causes,omitempty"`
}

// StaleCause is how many raw-mapped samples one cause keeps from raw
// reads and what makes them raw again. Causes: changed_since_mapping,
// extents_not_the_files, writable_by_untrusted_users, not_yet_checked,
// unchecked.
type StaleCause struct {
	Cause   string `msgpack:"cause"`
	Samples int    `msgpack:"samples"`
	Fix     string `msgpack:"fix"`
}

// SessionInfo is one open session: whose, over what, with how much
// memory.
type SessionInfo struct {
	UID          int     `msgpack:"uid"` // its owner (for tcp, the TCP principal)
	TCP          bool    `msgpack:"tcp"`
	Dataset      string  `msgpack:"dataset"`
	Backend      string  `msgpack:"backend"`
	Memory       string  `msgpack:"memory"`    // pinned or gpu
	Device       int     `msgpack:"device_id"` // the GPU of gpu memory
	GPUPath      string  `msgpack:"gpu_path"`  // for gpu memory: cufile or bounce
	BatchBytes   int64   `msgpack:"batch_bytes"`
	SamplerBytes int64   `msgpack:"sampler_bytes"`
	OpenedUnix   int64   `msgpack:"opened_unix"`  // when it opened, in seconds since the epoch
	IdleSeconds  float64 `msgpack:"idle_seconds"` // since its last request; 0 while it streams
	Streaming    bool    `msgpack:"streaming"`
	// BackendWhy: why Backend when the session's open named none; "" when named.
	BackendWhy string `msgpack:"backend_why"`
}

// Budget is one of the daemon's limits and how much of it is used:
// batch_memory and sample_order_memory in bytes, sessions (all owners)
// and sessions_of_the_caller in sessions, connections (all peers) in
// connections; Source says where the limit came from (a flag, or for a
// memory budget left to its default what it was derived from: the
// memory cgroup's limit, MemTotal, RLIMIT_MEMLOCK).
type Budget struct {
	Name   string `msgpack:"name"`
	Used   int64  `msgpack:"used"`
	Limit  int64  `msgpack:"limit"`
	Source string `msgpack:"source"`
}

// ReloadResponse says what a reload did with each dataset, sorted by name.
type ReloadResponse struct {
	Datasets []Reloaded `msgpack:"datasets"`
}

// Reloaded is one dataset's outcome of a reload.
type Reloaded struct {
	Dataset string `msgpack:"dataset"`
	Outcome string `msgpack:"outcome"` // reloaded, added, removed or failed (session.ReloadReplaced...)
	Samples int    `msgpack:"samples"` // what new sessions are served (0: none)
	Error   string `msgpack:"error,omitempty"`
}

// ErrorResponse is the body of every error status: the message for
// people, and a machine-readable code (one of the Code constants; absent
// for an error no sentinel names) for a client to branch on.
type ErrorResponse struct {
	Error string `msgpack:"error"`
	Code  string `msgpack:"code,omitempty"`
}

// Error codes: ErrorResponse.Code and NextResponse.ErrorCode, one per kind
// of refusal a client may act on. The text beside them is for people and
// may change; a code does not.
const (
	CodeInvalid      = "invalid"       // a field out of range, an unknown backend or option, a malformed request
	CodeNotFound     = "not_found"     // unknown dataset or session
	CodeReaped       = "reaped"        // a session the daemon closed as idle (404): reopen it where it was
	CodeForbidden    = "forbidden"     // the caller may not read the dataset, or the session is another user's
	CodeBusy         = "busy"          // every batch slot is held
	CodeConflict     = "conflict"      // the dataset's map is stale or its device unreadable
	CodeRankMismatch = "rank_mismatch" // the ranks of one job disagree (sampling, dataset, shard)
	CodeLimit        = "limit"         // the daemon's session limit
	CodeNoSpace      = "no_space"      // no room for the session's batch memory
)
