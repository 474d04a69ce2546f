package backend

import (
	"context"
	"sync"
	"sync/atomic"
)

// Pool reads batches with a fixed set of workers, one request at a time
// each: what backends that read sample by sample (file, cufile) share.
// read is called with the worker's number (0..workers-1) and sets nothing
// itself: its error becomes the request's Err.
type Pool struct {
	init func() error // run by each worker on its goroutine before its first read
	read func(worker int, r *Request) error
	jobs chan poolJob
	wg   sync.WaitGroup

	samples, errs atomic.Int64
}

type poolJob struct {
	ctx  context.Context
	req  *Request
	done func(error)
}

// NewPool starts workers goroutines calling read.
func NewPool(workers int, read func(worker int, r *Request) error) *Pool {
	return NewPoolInit(workers, nil, read)
}

// NewPoolInit is NewPool whose workers each first call init (nil: none)
// on their own goroutine, e.g. to lock and set up their OS thread; a
// worker whose init failed fails every request it takes with that error.
func NewPoolInit(workers int, init func() error, read func(worker int, r *Request) error) *Pool {
	p := &Pool{init: init, read: read, jobs: make(chan poolJob, 4*workers)}
	for i := range workers {
		p.wg.Add(1)
		go p.worker(i)
	}
	return p
}

// ReadBatch reads every request and returns as Backend.ReadBatch says.
func (p *Pool) ReadBatch(ctx context.Context, reqs []Request) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	wg.Add(len(reqs))
	for i := range reqs {
		p.jobs <- poolJob{ctx: ctx, req: &reqs[i], done: func(err error) {
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
	var initErr error
	if p.init != nil {
		initErr = p.init()
	}
	for j := range p.jobs {
		err := j.ctx.Err()
		switch {
		case err != nil:
		case initErr != nil:
			err = &SampleError{Index: j.req.Index, Path: j.req.Sample.Path, Err: initErr}
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
