// SPDX-License-Identifier: Apache-2.0

// Package wire is loaderd's protocol on the wire, in one place.
// It holds every request, response and stream frame with its msgpack keys and ranges.
// Every client message is decoded here and checked before anything is allocated.
// Package serve converts these types to the session core's.
// python/nvfeed/_wire.py mirrors them key by key; a test checks both ways.
//
// Bodies are msgpack with snake_case keys; unknown keys are refused.
// Errors are {"error": "...", "code": "..."} with a 4xx or 5xx status.
//
//	GET    /v1/backends               -            -> BackendsResponse
//	GET    /v1/datasets               -            -> DatasetsResponse
//	GET    /v1/status                 -            -> StatusResponse
//	POST   /v1/reload                 -            -> ReloadResponse (uid 0 on the unix socket only)
//	POST   /v1/sessions               OpenRequest  -> OpenResponse
//	POST   /v1/sessions/{id}/next     NextRequest  -> NextResponse
//	POST   /v1/sessions/{id}/release  ReleaseRequest
//	POST   /v1/sessions/{id}/memory   "Upgrade: nvfeed-memory" -> 101, one MemoryResponse frame
//	POST   /v1/sessions/{id}/stream   StreamRequest, "Upgrade: nvfeed-stream" -> 101, then frames
//	GET    /v1/sessions/{id}/state    -            -> loader.State
//	DELETE /v1/sessions/{id}
//	GET    /metrics (Prometheus text), GET /healthz
//
// The read-only GETs answer JSON with the same keys to "Accept: application/json".
//
// A number or string out of its range is answered 400 naming the field, value and range.
// docs/protocol.md has the table of ranges.
package wire

import (
	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

// OpenRequest opens a session over a registered dataset.
// Its loader fields are loader.Request's; docs/protocol.md lists the ranges.
type OpenRequest struct {
	Dataset        string `msgpack:"dataset"` // a registered dataset's name
	loader.Request `msgpack:",inline"`
	// Fingerprint: "" or the fingerprint the client expects; another is refused.
	Fingerprint string `msgpack:"fingerprint"`
	// JobID: "" or the job this session is a rank of.
	// The ranks of one job must agree on dataset and sampling.
	JobID string `msgpack:"job_id"`
	// Files: DALI's files=, the samples to read in order; empty means all.
	Files []string `msgpack:"files,omitempty"`
	// Webdataset datasets only: ext, missing_component_behavior, case_sensitive_extensions.
	Ext                      []string `msgpack:"ext"`
	MissingComponentBehavior string   `msgpack:"missing_component_behavior"`
	CaseSensitiveExtensions  *bool    `msgpack:"case_sensitive_extensions"`
}

// OpenResponse describes the new session, its batch memory and its first position.
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
	// Content summarises the dataset for ranks on other nodes to compare.
	Content *bmap.Content `msgpack:"content,omitempty"`
	// Reader is the DALI reader: "file", "numpy" or "webdataset".
	Reader string `msgpack:"reader"`
	// Components is K, a webdataset sample's outputs; 0 for other readers.
	Components int `msgpack:"components"`
	// NotRaw: for a raw backend, the samples read through the filesystem, by cause.
	NotRaw []StaleCause `msgpack:"not_raw,omitempty"`
	// Skipped: samples left out by missing_component_behavior "skip".
	// SkippedLacking counts, per ext entry, how many of them lack it.
	Skipped        int   `msgpack:"skipped,omitempty"`
	SkippedLacking []int `msgpack:"skipped_lacking,omitempty"`
}

// MemoryUpgrade is the Upgrade header value that asks for a session's batch memory.
// Only the owner gets it, on the unix socket only.
// The daemon answers 101 and one frame carrying the descriptor as SCM_RIGHTS.
// The mapping stays valid after the session and the daemon are gone.
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
	// Offsets and Lengths of each sample in the shared memory.
	// A webdataset sample has K entries, sample-major, each in its own room.
	// Length 0 is an empty output or a failed sample.
	Offsets []int64  `msgpack:"offsets"`
	Lengths []int64  `msgpack:"lengths"`
	Labels  []int32  `msgpack:"labels"` // one per sample; empty for a webdataset dataset
	Indices []int32  `msgpack:"indices"`
	Failed  []int    `msgpack:"failed,omitempty"` // positions whose sample could not be read (length 0)
	Errors  []string `msgpack:"errors,omitempty"` // one message per failed sample: its path and the cause
	// Numpy datasets only: the .npy descr of the elements and each sample's shape.
	// A sample's bytes are a C-order array of that shape. Labels are zeros.
	DType  string    `msgpack:"dtype,omitempty"`
	Shapes [][]int64 `msgpack:"shapes,omitempty"`
	// In a stream only: the error that ended it and the status a request would get.
	Error       string `msgpack:"error,omitempty"`
	ErrorStatus int    `msgpack:"error_status,omitempty"`
	ErrorCode   string `msgpack:"error_code,omitempty"` // as ErrorResponse.Code

	// In a stream only: the answer to a stop; the releases are done (the last frame).
	Stopped bool `msgpack:"stopped,omitempty"`
}

// StreamUpgrade is the Upgrade header value that starts a stream.
const StreamUpgrade = "nvfeed-stream"

// StreamRequest starts a stream, optionally at a position.
//
// Frames go both ways: a 4-byte big-endian length, then msgpack.
// The daemon sends a NextResponse per batch as soon as it is read.
// The client sends StreamControl frames: releases without reply, or a stop.
// A stop is answered with stopped once every batch not kept is released.
// A connection closed without a stop leaves every delivered batch held.
// The next stream's keep says which the client still holds; the rest are released.
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

// NextRequest may release slots first and may name the batch wanted.
// Without a position the session's next batch comes.
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

// DatasetInfo is one registered dataset: its size and freshness counts.
// It names no file. Counts go only to a caller who may read the dataset.
type DatasetInfo struct {
	Name string `msgpack:"name"`
	// Readable: the caller may read every sample; else only name, reader and freshness.
	Readable bool   `msgpack:"readable"`
	Samples  *int   `msgpack:"samples,omitempty"` // in the map: what sessions serve
	Bytes    *int64 `msgpack:"bytes,omitempty"`   // the samples' sizes when mapped, summed
	Classes  *int   `msgpack:"classes,omitempty"`
	// Fresh raw samples are readable from their extents.
	// Stale ones changed since mapping and are read through the filesystem.
	// Without a guard every raw sample counts as stale.
	Fresh *int `msgpack:"fresh,omitempty"`
	Stale *int `msgpack:"stale,omitempty"`
	// Writable raw-mapped samples may be changed by an untrusted user: never read raw.
	Writable       *int `msgpack:"writable,omitempty"`
	FilesystemOnly *int `msgpack:"filesystem_only,omitempty"`
	// Pending raw-mapped samples are not judged yet: read through the filesystem.
	Pending *int `msgpack:"pending,omitempty"`
	// Added counts files in the dataset's folders the map lacks.
	// -1: the folders could not be listed; absent: the caller may not list them.
	Added       *int   `msgpack:"added,omitempty"`
	Freshness   string `msgpack:"freshness"`             // watch, read, none or unchecked
	Fingerprint string `msgpack:"fingerprint,omitempty"` // the same on every node holding a copy: its samples' paths, labels and sizes
	Reader      string `msgpack:"reader"`                // "file", "numpy" or "webdataset": the DALI reader whose samples these are
	DType       string `msgpack:"dtype"`                 // numpy: the arrays' element type as an .npy descr ("<f4"); "" for file datasets
}

// StatusResponse is what the daemon serves and holds, as the caller may see it.
// Root on the unix socket sees every session; another caller its own, never their ids.
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

// Budget is one of the daemon's limits and how much of it is used.
// Source says where the limit came from: a flag or what its default was derived from.
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

// ErrorResponse is the body of every error status.
// Code is one of the Code constants, absent when no sentinel names the error.
type ErrorResponse struct {
	Error string `msgpack:"error"`
	Code  string `msgpack:"code,omitempty"`
}

// Error codes for ErrorResponse.Code and NextResponse.ErrorCode.
// A code does not change; the text beside it may.
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
