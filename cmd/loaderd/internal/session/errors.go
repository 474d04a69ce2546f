// SPDX-License-Identifier: Apache-2.0

package session

import "errors"

// Sentinel errors; a transport maps them to its status codes. Every error
// from a Manager wraps one of them, or one of package loader's (a
// loader.ErrNoSpace: the machine had no room for a session's batch
// memory), or is an internal failure; its message names the dataset,
// session, field or sample concerned.
var (
	ErrInvalid   = errors.New("invalid request")      // a field out of range, an unknown backend or option
	ErrNotFound  = errors.New("not found")            // unknown dataset or session
	ErrForbidden = errors.New("forbidden")            // the session belongs to another user
	ErrBusy      = errors.New("all batch slots held") // release batches before asking for more
	ErrLimit     = errors.New("too many sessions")    // the daemon's session limit
	// ErrNoSpace: the session's batch memory would take all sessions'
	// past the daemon's budget (Config.MaxLockedBytes). The machine's own
	// shortage is loader.ErrNoSpace, with the same text.
	ErrNoSpace  = errors.New("no room for batch memory")
	ErrConflict = errors.New("dataset not readable") // the map is stale or the device cannot be read
	// ErrDisagree: a session of a job (OpenParams.JobID) would read with
	// other sampling, another dataset, or a shard another session of the
	// job reads (jobs.go).
	ErrDisagree = errors.New("ranks disagree")
)
