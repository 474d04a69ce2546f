// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/loader"
)

// Between the wire (package wire: msgpack structs) and the session core
// (package session: plain Go types), in one place: each message's
// conversion, and each sentinel's HTTP status.

// status is the HTTP status err's sentinel maps to.
func status(err error) int {
	s, _ := kind(err)
	return s
}

// code is the machine-readable code of err's sentinel (wire.Code...), ""
// for an error no sentinel names.
func code(err error) string {
	_, c := kind(err)
	return c
}

// kind is the HTTP status and the code err's sentinel maps to: 500 and
// "" for an internal failure.
func kind(err error) (int, string) {
	switch {
	case errors.Is(err, wire.ErrVersion):
		return http.StatusBadRequest, wire.CodeVersion
	case errors.Is(err, session.ErrInvalid), errors.Is(err, wire.ErrMalformed):
		return http.StatusBadRequest, wire.CodeInvalid
	case errors.Is(err, session.ErrReaped):
		return http.StatusNotFound, wire.CodeReaped
	case errors.Is(err, session.ErrNotFound):
		return http.StatusNotFound, wire.CodeNotFound
	case errors.Is(err, session.ErrForbidden):
		return http.StatusForbidden, wire.CodeForbidden
	case errors.Is(err, session.ErrBusy):
		return http.StatusConflict, wire.CodeBusy
	case errors.Is(err, session.ErrDisagree):
		return http.StatusConflict, wire.CodeRankMismatch
	case errors.Is(err, session.ErrConflict):
		return http.StatusConflict, wire.CodeConflict
	case errors.Is(err, session.ErrLimit):
		return http.StatusTooManyRequests, wire.CodeLimit
	case errors.Is(err, session.ErrNoSpace), errors.Is(err, loader.ErrNoSpace):
		return http.StatusInsufficientStorage, wire.CodeNoSpace
	case errors.Is(err, context.Canceled):
		return 499, "" // client went away
	}
	return http.StatusInternalServerError, ""
}

// openParams is an open request's session form.
func openParams(r wire.OpenRequest) session.OpenParams {
	return session.OpenParams{Dataset: r.Dataset, Request: r.Request, Fingerprint: r.Fingerprint, JobID: r.JobID, Files: r.Files,
		Ext: r.Ext, MissingComponentBehavior: r.MissingComponentBehavior, CaseSensitiveExtensions: r.CaseSensitiveExtensions}
}

// openResponse is an opened session's wire form.
func openResponse(o session.Opened) wire.OpenResponse {
	return wire.OpenResponse{ID: o.ID, Backend: o.Backend, BackendWhy: o.BackendWhy, Memory: o.Memory, GPUPath: o.GPUPath,
		PrefetchQueueDepth: o.PrefetchQueueDepth, ReleaseAfter: o.ReleaseAfter, Epoch: o.Epoch, Iteration: o.Iteration,
		EpochBatches: o.EpochBatches, State: o.State, Fingerprint: o.Fingerprint, Content: o.Content, Reader: o.Reader, NotRaw: staleCausesWire(o.NotRaw), Components: o.Components,
		Skipped: o.Skipped, SkippedLacking: o.SkippedLacking}
}

// staleCausesWire is causes' wire form.
func staleCausesWire(causes []session.StaleCause) []wire.StaleCause {
	var out []wire.StaleCause
	for _, c := range causes {
		out = append(out, wire.StaleCause{Cause: c.Cause, Samples: c.Samples, Fix: c.Fix})
	}
	return out
}

// nextResponse is a delivery's wire form.
func nextResponse(d session.Delivery) wire.NextResponse {
	return wire.NextResponse{EndOfEpoch: d.EndOfEpoch, Epoch: d.Epoch, Iteration: d.Iteration, EpochBatches: d.EpochBatches,
		Slot: d.Slot, Offsets: d.Offsets, Lengths: d.Lengths, Labels: d.Labels, Indices: d.Indices, Failed: d.Failed, Errors: d.Errors,
		DType: d.DType, Shapes: d.Shapes}
}

// errorFrame is the last frame of a stream that ended with err.
func errorFrame(err error) wire.NextResponse {
	return wire.NextResponse{Error: err.Error(), ErrorStatus: status(err), ErrorCode: code(err)}
}

// position is the batch an epoch and an iteration name: nil for neither;
// both or neither (an error wrapping wire.ErrMalformed).
func position(epoch, iteration *int) (*session.Position, error) {
	switch {
	case epoch != nil && iteration != nil:
		return &session.Position{Epoch: *epoch, Iteration: *iteration}, nil
	case epoch != nil || iteration != nil:
		return nil, fmt.Errorf("%w: give both epoch and iteration, or neither", wire.ErrMalformed)
	}
	return nil, nil
}

// datasetsResponse is the datasets' wire form.
func datasetsResponse(ds []session.DatasetInfo) wire.DatasetsResponse {
	var r wire.DatasetsResponse
	if ds != nil { // nil stays nil (msgpack nil), empty stays empty (an empty array)
		r.Datasets = make([]wire.DatasetInfo, len(ds))
	}
	for i, d := range ds {
		w := wire.DatasetInfo{Name: d.Name, Readable: d.Readable, Freshness: d.Freshness, Reader: d.Reader}
		if d.Readable { // counts only to a caller who may read the dataset
			w.Samples, w.Bytes, w.Classes, w.Fresh, w.Stale, w.Writable, w.FilesystemOnly, w.Pending = &d.Samples, &d.Bytes, &d.Classes, &d.Fresh, &d.Stale, &d.Writable, &d.FilesystemOnly, &d.Pending
			w.Fingerprint, w.DType = d.Fingerprint, d.DType
			if d.Listable {
				w.Added = &d.Added
			}
		}
		r.Datasets[i] = w
	}
	return r
}

// statusResponse is a status's wire form; conns is the connections
// budget (nil: not listening, as in tests of the handler alone).
func statusResponse(st session.Status, conns *wire.Budget) wire.StatusResponse {
	r := wire.StatusResponse{Datasets: []wire.DatasetStatus{}, Sessions: []wire.SessionInfo{}, Budgets: []wire.Budget{}}
	infos := make([]session.DatasetInfo, len(st.Datasets))
	for i, d := range st.Datasets {
		infos[i] = d.DatasetInfo
	}
	for i, d := range datasetsResponse(infos).Datasets {
		ds := wire.DatasetStatus{DatasetInfo: d}
		ds.StaleCauses = staleCausesWire(st.Datasets[i].StaleCauses)
		r.Datasets = append(r.Datasets, ds)
	}
	for _, s := range st.Sessions {
		r.Sessions = append(r.Sessions, wire.SessionInfo{UID: s.UID, TCP: s.TCP, Dataset: s.Dataset, Backend: s.Backend, BackendWhy: s.BackendWhy, Memory: s.Memory, Device: s.Device,
			GPUPath: s.GPUPath, BatchBytes: s.BatchBytes, SamplerBytes: s.SamplerBytes, OpenedUnix: s.Opened.Unix(), IdleSeconds: s.Idle.Seconds(), Streaming: s.Streaming})
	}
	for _, b := range st.Budgets {
		r.Budgets = append(r.Budgets, wire.Budget{Name: b.Name, Used: b.Used, Limit: b.Limit, Source: b.Source})
	}
	if conns != nil {
		r.Budgets = append(r.Budgets, *conns)
	}
	return r
}

// reloadResponse is a reload's outcomes' wire form.
func reloadResponse(res []session.Reloaded) wire.ReloadResponse {
	var r wire.ReloadResponse
	if res != nil { // nil stays nil, empty stays empty
		r.Datasets = make([]wire.Reloaded, len(res))
	}
	for i, d := range res {
		r.Datasets[i] = wire.Reloaded{Dataset: d.Dataset, Outcome: d.Outcome, Samples: d.Samples, Error: d.Error}
	}
	return r
}
