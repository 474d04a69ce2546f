// Command loaderd reads dataset batches through the loader: it serves them
// to training processes, or benchmarks a backend.
//
//	loaderd serve --socket PATH --dataset NAME=MAP [--dataset NAME=MAP ...] [--listen 127.0.0.1:PORT]
//	loaderd bench --bmap FILE [--backend file] [--batch-size 64] [--batches N | --epochs E]
//	              [--prefetch 2] [--workers N] [--direct] [--shuffle] [--seed S] [--verify] [--json]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/benchrun"
	"github.com/nvfeed/nvfeed/internal/serve"
	"github.com/nvfeed/nvfeed/loader"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: loaderd serve --socket PATH --dataset NAME=MAP [--dataset NAME=MAP ...] [--listen 127.0.0.1:PORT]
                     [--shm-dir /dev/shm] [--session-timeout 60s]
       loaderd bench --bmap FILE [--backend file|gds|bam] [--batch-size 64] [--batches N | --epochs E]
                     [--prefetch 2] [--workers N] [--direct] [--shuffle] [--seed S] [--verify] [--json]
                     [--queue-depth N] [--engine auto|uring|pread] [--queues N] [--block-size B]
                     [--cache-mb M] [--on-stale fallback|fail] [--freshness watch|read] [--skip-errors]
                     [--iolog FILE] [--cpuprofile FILE]`

// errUsage marks errors that print usage; exit status 2.
var errUsage = errors.New("usage")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	var err error
	switch {
	case len(args) == 0:
		err = fmt.Errorf("%w: no command", errUsage)
	case args[0] == "bench":
		err = bench(ctx, args[1:], stdout, stderr)
	case args[0] == "serve":
		err = serveCmd(ctx, args[1:], stderr)
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprintln(stderr, usage)
		return 0
	default:
		err = fmt.Errorf("%w: unknown command %q", errUsage, args[0])
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "loaderd: %v\n%s\n", err, usage)
		return 2
	}
	fmt.Fprintf(stderr, "loaderd: %v\n", err)
	return 1
}

func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	mapPath := fs.String("bmap", "", "block map of the dataset (required)")
	backend := fs.String("backend", "file", "backend: file, gds or bam")
	batch := fs.Int("batch-size", 64, "samples per batch")
	batches := fs.Int("batches", 0, "stop after N batches")
	epochs := fs.Int("epochs", 0, "stop after E epochs (default 1 when --batches is not given)")
	prefetch := fs.Int("prefetch", 2, "batches read ahead (prefetch_queue_depth)")
	workers := fs.Int("workers", 0, "I/O concurrency (default: the backend's)")
	direct := fs.Bool("direct", false, "file backend: O_DIRECT, bypassing the page cache")
	shuffle := fs.Bool("shuffle", false, "random_shuffle: a full permutation per epoch")
	seed := fs.Uint64("seed", 0, "shuffle seed")
	shard := fs.Int("shard-id", 0, "shard_id")
	shards := fs.Int("num-shards", 1, "num_shards")
	verify := fs.Bool("verify", false, "check every sample against a plain read of its file (slows the run: the timing includes it)")
	asJSON := fs.Bool("json", false, "print one JSON object on stdout instead of a table")
	qd := fs.Int("queue-depth", 0, "gds/bam: requests in flight per queue (default 32 for gds, 64 for bam)")
	engine := fs.String("engine", "auto", "gds/bam: auto (io_uring, else pread), uring or pread")
	queues := fs.Int("queues", 0, "bam: submission queues (default 4)")
	blockSize := fs.Int("block-size", 0, "bam: request size in bytes (default 4096)")
	maxReq := fs.Int("max-request", 0, "gds: split reads larger than this many bytes (default 1 MiB)")
	cacheMB := fs.Int64("cache-mb", 0, "bam: block cache size in MiB (default 256; -1 disables)")
	onStale := fs.String("on-stale", "fallback", "gds/bam: a file changed since mapping is read through the filesystem (fallback) or refused (fail)")
	freshness := fs.String("freshness", "watch", "gds/bam: how changed files are caught after the check at open: watch (inotify on the class directories) or read (stat after every raw read)")
	skipErrors := fs.Bool("skip-errors", false, "deliver batches with failed samples (length 0) instead of failing")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the run to FILE")
	iolog := fs.String("iolog", "", "gds/bam: write every device read to FILE as a fio iolog (v2) for replay")
	fs.Usage = func() { fmt.Fprintln(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *mapPath == "" {
		return fmt.Errorf("%w: --bmap is required", errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	m, err := bmap.Load(*mapPath)
	if err != nil {
		return err
	}
	lo := loader.Options{BatchSize: *batch, ShardID: *shard, NumShards: *shards, RandomShuffle: *shuffle, Seed: *seed,
		PrefetchQueueDepth: *prefetch, Backend: *backend, Workers: *workers, Direct: *direct, SkipErrors: *skipErrors,
		Raw: loader.RawOptions{Engine: *engine, QueueDepth: *qd, Queues: *queues, BlockSize: *blockSize, MaxRequest: *maxReq,
			CacheBytes: *cacheMB << 20, OnStale: *onStale, Freshness: *freshness}}
	if *iolog != "" {
		f, err := os.Create(*iolog)
		if err != nil {
			return err
		}
		defer f.Close()
		lo.Raw.Trace = f
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := benchrun.Run(ctx, m, lo, benchrun.Options{Batches: *batches, Epochs: *epochs, Verify: *verify})
	if err != nil {
		if errors.Is(err, loader.ErrOptions) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(res)
	}
	benchrun.Table(stdout, res)
	benchrun.InfoLine(stdout, res)
	if *verify {
		fmt.Fprintf(stdout, "verified: %d samples equal their files (the timing includes verification)\n", res.Verified)
	}
	return nil
}

// datasetFlags collects repeated --dataset NAME=MAP flags.
type datasetFlags map[string]string

func (d datasetFlags) String() string { return fmt.Sprint(map[string]string(d)) }

func (d datasetFlags) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("want NAME=MAPFILE, got %q", v)
	}
	if _, dup := d[name]; dup {
		return fmt.Errorf("dataset %q given twice", name)
	}
	d[name] = path
	return nil
}

func serveCmd(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "unix socket to listen on (required); ready when it exists")
	listen := fs.String("listen", "", "also listen on this loopback TCP address, e.g. 127.0.0.1:7070")
	shmDir := fs.String("shm-dir", "/dev/shm", "directory for sessions' shared batch memory")
	timeout := fs.Duration("session-timeout", 60*time.Second, "close sessions idle for longer than this")
	maxMem := fs.Int64("max-session-mb", 16<<10, "refuse sessions needing more batch memory than this (MiB)")
	datasets := datasetFlags{}
	fs.Var(datasets, "dataset", "NAME=MAPFILE: register a dataset (repeatable, at least one)")
	fs.Usage = func() { fmt.Fprintln(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *socket == "" || len(datasets) == 0 {
		return fmt.Errorf("%w: --socket and at least one --dataset are required", errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	maps := map[string]*bmap.Map{}
	for name, path := range datasets {
		m, err := bmap.Load(path)
		if err != nil {
			return fmt.Errorf("dataset %s: %w", name, err)
		}
		maps[name] = m
	}
	srv := serve.New(serve.Config{Datasets: maps, ShmDir: *shmDir, SessionTimeout: *timeout, MaxSessionBytes: *maxMem << 20})
	return srv.Run(ctx, *socket, *listen)
}
