// SPDX-License-Identifier: Apache-2.0

// Package readpool is what backends that read sample by sample (file,
// cufile) share: a fixed set of workers, one request at a time each.
package readpool

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/nvfeed/nvfeed/loader/backend"
)

// Pool reads batches with a fixed set of workers, one request at a time
// each: what backends that read sample by sample (file, cufile) share.
// read is called with the worker's number (0..workers-1) and sets nothing
// itself: its error becomes the request's Err.
type Pool struct {
	read func(worker int, r *backend.Request) error
	jobs chan poolJob
	wg   sync.WaitGroup

	samples, errs atomic.Int64
}

type poolJob struct {
	ctx  context.Context
	req  *backend.Request
	pos  int                                             // the request's position in its batch
	read func(worker, pos int, r *backend.Request) error // nil: the pool's own
	done func(error)
}

// NewPool starts workers goroutines calling read.
func NewPool(workers int, read func(worker int, r *backend.Request) error) *Pool {
	p := &Pool{read: read, jobs: make(chan poolJob, 4*workers)}
	for i := range workers {
		p.wg.Add(1)
		go p.worker(i)
	}
	return p
}

// ReadBatch reads every request and returns as backend.Backend.ReadBatch says.
func (p *Pool) ReadBatch(ctx context.Context, reqs []backend.Request) error {
	return p.readBatch(ctx, reqs, nil)
}

// ReadBatchFunc is ReadBatch with read, given each request's position in
// reqs, in place of the pool's own: for what a backend prepared for the
// whole batch first (e.g. files opened elsewhere).
func (p *Pool) ReadBatchFunc(ctx context.Context, reqs []backend.Request, read func(pos int, r *backend.Request) error) error {
	return p.readBatch(ctx, reqs, func(_, pos int, r *backend.Request) error { return read(pos, r) })
}

func (p *Pool) readBatch(ctx context.Context, reqs []backend.Request, read func(worker, pos int, r *backend.Request) error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	wg.Add(len(reqs))
	for i := range reqs {
		p.jobs <- poolJob{ctx: ctx, req: &reqs[i], pos: i, read: read, done: func(err error) {
			if err != nil {
				once.Do(func() { first = err })
			}
			wg.Done()
		}}
	}
	wg.Wait()
	p.samples.Add(int64(len(reqs)))
	for i := range reqs {
		if reqs[i].Err != nil {
			p.errs.Add(1)
		}
	}
	if first == nil {
		return ctx.Err()
	}
	return first
}

func (p *Pool) worker(id int) {
	defer p.wg.Done()
	for j := range p.jobs {
		err := j.ctx.Err()
		switch {
		case err != nil:
		case j.read != nil:
			err = j.read(id, j.pos, j.req)
		default:
			err = p.read(id, j.req)
		}
		j.req.Err = err
		j.done(err)
	}
}

// Counts returns the samples read (failed ones included) and failed.
func (p *Pool) Counts() (samples, errors int64) { return p.samples.Load(), p.errs.Load() }

// Close stops the workers. No ReadBatch may be running.
func (p *Pool) Close() {
	close(p.jobs)
	p.wg.Wait()
}
