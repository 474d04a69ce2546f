// SPDX-License-Identifier: Apache-2.0

// Command loaderd reads dataset batches through the loader: it serves them
// to training processes, benchmarks a backend, or lists the backends.
//
//	loaderd serve --socket PATH --dataset NAME=MAP [--dataset NAME=MAP ...] [--listen 127.0.0.1:PORT] [--log-format text|json] [--log-level info]
//	loaderd reload [--socket PATH | --config FILE]
//	loaderd bench --bmap FILE [--backend file] [--batch-size 64] [--batches N | --epochs E] [backend options]
//	loaderd backends [--json]
//	loaderd check [--dataset NAME=MAP ...] [--json]
//
// `loaderd COMMAND --help` prints the command's usage and flags.
// Backend option flags come from the backends' descriptions.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/signal"
	"os/user"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/bmap/fresh"
	"github.com/nvfeed/nvfeed/bmap/wds"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/benchrun"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/check"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/serve"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/internal/caps"
	"github.com/nvfeed/nvfeed/internal/cli"
	"github.com/nvfeed/nvfeed/internal/cred"
	"github.com/nvfeed/nvfeed/internal/cuda"
	"github.com/nvfeed/nvfeed/loader"
	"github.com/nvfeed/nvfeed/loader/backend"
	"github.com/nvfeed/nvfeed/loader/batchmem"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const overview = `usage: loaderd COMMAND [flags]

Serves dataset batches read from block maps (mkbmap) to training
processes over a unix socket, and measures and checks the machine.

commands:
  serve      the daemon: serve registered datasets on a unix socket
  reload     make the running daemon read its datasets' maps again (root)
  status     what the running daemon serves and holds: datasets, stale samples and why, sessions, budgets
  bench      read a dataset through a backend and report its throughput
  backends   list the backends, their options' flags, defaults and limits
  check      what this machine offers: io_uring, O_DIRECT, driver, CUDA, cuFile, GPUs, topology
  version    print loaderd's version

loaderd COMMAND --help prints the command's usage and every flag.`

const serveUsage = `usage: loaderd serve [--config FILE] --socket PATH --dataset NAME=MAP [--dataset NAME=MAP ...]
                     [--socket-group GROUP] [--socket-mode 0660] [--listen 127.0.0.1:PORT --tcp-token FILE]
                     [--tcp-user nobody] [--session-timeout 60s] [--max-session-mb 16384] [--max-sessions 64]
                     [--max-sessions-per-uid 16] [--max-locked-mb MiB] [--max-locked-mb-per-uid MiB] [--max-device-mb 16384] [--max-conns-per-uid 64] [--max-replays-per-uid N] [--max-checks-per-uid 1]
                     [--max-sampler-mb MiB] [--max-conns N] [--root-conns 16]
                     [--read-timeout 30s] [--write-timeout 2m] [--idle-timeout 2m] [--stream-idle-timeout 10m]
                     [--engines session|device] [--trusted-uid UID[,UID...]] [--trusted-gid GID[,GID...]]
                     [--check-before-ready] [--cuda-lib-dir DIR] [--log-format text|json] [--log-level debug|info|warn|error]

Serves the datasets' batches on a unix socket (created with its directory
if missing; ready when it exists, and under systemd Type=notify once
READY=1 is sent). SIGHUP or loaderd reload reads every map file again
(the --dataset flags', or else the config file's dataset lines) without
dropping sessions. SIGTERM stops it.

flags:`

const reloadUsage = `usage: loaderd reload [--socket PATH | --config FILE]

Makes the daemon listening on the socket read every dataset's map file
again (POST /v1/reload, root only): new sessions get the new maps, open
sessions keep theirs until they close, and a map that does not load
leaves its dataset as it was. Prints what became of each dataset; exits
1 if any map did not load. The socket is --socket, else the config
file's socket line, else ` + defaultSocket + `.

flags:`

const statusUsage = `usage: loaderd status [--socket PATH | --config FILE] [--json]

Asks the daemon listening on the socket (GET /v1/status) what it serves
and holds: each dataset's samples (fresh, stale, writable by untrusted
users, filesystem-only) and why samples are read through the filesystem,
with the fix; the open sessions by user (root sees every user's; anyone
else only their own); the budgets used (batch memory, sample-order
memory, sessions, connections). The answer follows the caller's rights,
as /v1/datasets does. The socket is --socket, else the config file's
socket line, else ` + defaultSocket + `.

flags:`

const benchUsage = `usage: loaderd bench --bmap FILE [--backend NAME] [--batch-size 64] [--batches N | --epochs E]
                     [--prefetch 2] [--memory pinned|gpu --device-id 0] [--shuffle [--shuffle-mode permute|dali] [--initial-fill 1024]] [--seed S]
                     [--shard-id K --num-shards N] [--pad-last-batch] [--stick-to-shard] [--verify] [--json]
                     [--skip-errors] [--iolog FILE] [--cpuprofile FILE] [--cuda-lib-dir DIR] [--log-format text|json] [--log-level info] [backend options]

Reads a dataset through a backend in this process and reports its
throughput (no daemon involved).

flags:`

const backendsUsage = `usage: loaderd backends [--json]

Lists the backends with their options' flags, defaults and limits.

flags:`

const checkUsage = `usage: loaderd check [--dataset NAME=MAP ...] [--cuda-lib-dir DIR] [--json]

Reports what this machine offers the loader: io_uring, O_DIRECT, the CUDA
libraries (where each was found, how, its version), driver, CUDA devices,
cuFile, GPUs, topology; with --dataset, each dataset's device too.

flags:`

// defaultSocket is where loaderd reload looks without --socket or --config
// (the deploy files' socket, and the Python client's default).
const defaultSocket = "/run/loaderd/loaderd.sock"

// version is this release, set at link time from python/nvfeed/VERSION
// (make build, make wheel): -ldflags "-X main.version=...".
var version = "dev"

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if len(args) >= 2 && args[0] == "help" { // loaderd help serve = loaderd serve --help
		args = []string{args[1], "--help"}
	}
	var err error
	switch {
	case len(args) == 0:
		fmt.Fprintf(stderr, "loaderd: no command\n%s\n(loaderd --help: the commands)\n", cli.FirstLine(overview))
		return 2
	case args[0] == "bench":
		err = bench(ctx, args[1:], stdout, stderr)
	case args[0] == "serve":
		err = serveCmd(ctx, args[1:], stdout, stderr)
	case args[0] == "reload":
		err = reloadCmd(ctx, args[1:], stdout, stderr)
	case args[0] == "status":
		err = statusCmd(ctx, args[1:], stdout, stderr)
	case args[0] == "backends":
		err = backendsCmd(args[1:], stdout, stderr)
	case args[0] == "check":
		err = checkCmd(args[1:], stdout, stderr)
	case args[0] == "--version" || args[0] == "version":
		fmt.Fprintf(stdout, "loaderd %s\n", version)
		return 0
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Fprintln(stdout, overview)
		return 0
	default:
		fmt.Fprintf(stderr, "loaderd: unknown command %q\n%s\n(loaderd --help: the commands)\n", args[0], cli.FirstLine(overview))
		return 2
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, cli.ErrUsage):
		fmt.Fprintf(stderr, "loaderd: %v\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "loaderd: %v\n", err)
	return 1
}

// logFlags are the logging flags of the commands that log.
type logFlags struct {
	format, level *string
}

// addLogFlags defines --log-format and --log-level on fs.
func addLogFlags(fs *flag.FlagSet) logFlags {
	return logFlags{
		format: fs.String("log-format", "text", "log lines on stderr as text (key=value) or json (one object a line)"),
		level:  fs.String("log-level", "info", "the least level logged: debug, info, warn or error"),
	}
}

// logger returns the logger the flags ask for, writing to w.
func (l logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(*l.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", *l.level)
	}
	o := &slog.HandlerOptions{Level: level}
	switch *l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		o.ReplaceAttr = secondsAttr
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", *l.format)
}

// secondsAttr renders a duration in a JSON log as float seconds, its key ending in "seconds".
func secondsAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() != slog.KindDuration {
		return a
	}
	key := a.Key
	if !strings.HasSuffix(key, "seconds") {
		key += "_seconds"
	}
	return slog.Float64(key, a.Value.Duration().Seconds())
}

// useLogger makes the flags' logger the default (the libraries log there)
// and returns it.
func useLogger(fs *flag.FlagSet, l logFlags, w io.Writer) (*slog.Logger, error) {
	log, err := l.logger(w)
	if err != nil {
		return nil, cli.UsageErr(fs, "%v", err)
	}
	slog.SetDefault(log)
	return log, nil
}

func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd bench", flag.ContinueOnError)
	mapPath := fs.String("bmap", "", "block map of the dataset (required)")
	backendName := fs.String("backend", loader.DefaultBackend, "backend: "+strings.Join(backendNames(), ", "))
	batch := fs.Int("batch-size", 64, "samples per batch")
	batches := fs.Int("batches", 0, "stop after N batches")
	epochs := fs.Int("epochs", 0, "stop after E epochs (default 1 when --batches is not given)")
	prefetch := fs.Int("prefetch", loader.DefaultPrefetchQueueDepth, "batches read ahead (prefetch_queue_depth)")
	memory := fs.String("memory", string(batchmem.Pinned), "where batches land: pinned (host) or gpu (with --backend cufile: cuFileRead into the device; any other backend: a staging copy per batch)")
	deviceID := fs.Int("device-id", 0, "the GPU for --memory gpu")
	shuffle := fs.Bool("shuffle", false, "random_shuffle: shuffle every epoch, as --shuffle-mode says")
	shuffleMode := fs.String("shuffle-mode", loader.ShufflePermute, "how --shuffle shuffles: permute (a full permutation per epoch) or dali (fn.readers.file's order exactly: its initial_fill buffer)")
	initialFill := fs.Int("initial-fill", loader.DefaultInitialFill, "initial_fill: the dali shuffle's buffer, in samples")
	seed := fs.Uint64("seed", 0, "shuffle seed")
	shard := fs.Int("shard-id", 0, "shard_id")
	shards := fs.Int("num-shards", 1, "num_shards")
	pad := fs.Bool("pad-last-batch", false, "pad_last_batch: pad every shard to the same length and whole batches")
	stick := fs.Bool("stick-to-shard", false, "stick_to_shard: read the same shard every epoch")
	verify := fs.Bool("verify", false, "check every sample against a plain read of its file (slows the run: the timing includes it)")
	asJSON := fs.Bool("json", false, "print one JSON object on stdout instead of a table")
	backendOpts := backendFlags(fs)
	skipErrors := fs.Bool("skip-errors", false, "deliver batches with failed samples (length 0) instead of failing")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the run to FILE")
	iolog := fs.String("iolog", "", "gds/bam: write every device read to FILE as a fio iolog (v2) for replay")
	asUser := fs.String("as-user", "", "read as the daemon reads for a client of this user (name or uid): its uid, gid and groups from the user database, and one freshness guard for the dataset, as the daemon keeps (default: this process's credentials)")
	cudaLibDir := addCUDALibDirFlag(fs)
	logs := addLogFlags(fs)
	if err := cli.Parse(fs, args, stdout, stderr, benchUsage); err != nil {
		return err
	}
	if err := cudaLibDir(); err != nil {
		return err
	}
	if *mapPath == "" {
		return cli.UsageErr(fs, "--bmap is required")
	}
	// The library takes 0 for its default; a flag given as 0 is an error.
	for _, f := range []struct {
		flag, field string
		v, max      int
	}{{"num-shards", "num_shards", *shards, loader.MaxSamples}, {"prefetch", "prefetch_queue_depth", *prefetch, loader.MaxPrefetchQueueDepth},
		{"initial-fill", "initial_fill", *initialFill, loader.MaxInitialFill}} {
		if f.v < 1 {
			return cli.UsageErr(fs, "--%s %d: %s %d not in [1, %d]", f.flag, f.v, f.field, f.v, f.max)
		}
	}
	if fs.NArg() > 0 {
		return cli.UsageErr(fs, "unexpected argument %q", fs.Arg(0))
	}
	log, err := useLogger(fs, logs, stderr)
	if err != nil {
		return err
	}
	m, err := bmap.Load(*mapPath)
	if err != nil {
		return err
	}
	lo := loader.Options{ReaderArgs: loader.ReaderArgs{BatchSize: *batch, ShardID: *shard, NumShards: *shards, RandomShuffle: *shuffle, Seed: *seed,
		Shuffle: *shuffleMode, InitialFill: *initialFill, PadLastBatch: *pad, StickToShard: *stick},
		PrefetchQueueDepth: *prefetch, Backend: *backendName, Memory: batchmem.Kind(*memory), Device: *deviceID, BackendOptions: backendOpts, SkipErrors: *skipErrors,
		Logger: log}
	if *asUser != "" {
		c, err := userCred(*asUser)
		if err != nil {
			return cli.UsageErr(fs, "--as-user %q: %v", *asUser, err)
		}
		lo.Cred = (*backend.Cred)(&c)
		// As the daemon: one freshness guard for the dataset, which the
		// backends share (a map with nothing to read raw has none).
		if g, err := fresh.Open(m, fresh.Watch, log); err == nil {
			defer g.Close()
			lo.Guard = g
		} else {
			log.Info("bench: no freshness guard for --as-user", "err", err)
		}
	}
	if *iolog != "" {
		f, err := os.Create(*iolog)
		if err != nil {
			return err
		}
		defer f.Close()
		lo.Trace = f
	}
	if *cpuProfile != "" {
		stop, err := startProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	res, err := benchrun.Run(ctx, m, lo, benchrun.Options{Batches: *batches, Epochs: *epochs, Verify: *verify})
	if errors.Is(err, backend.ErrDevice) {
		return fmt.Errorf("%w (or use --backend file)", err)
	}
	if err != nil {
		if errors.Is(err, loader.ErrOptions) {
			return cli.UsageErr(fs, "%v", err)
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

// userCred returns the credentials of a user named or numbered u: its
// uid, primary gid and the groups the user database gives it.
func userCred(u string) (cred.Cred, error) {
	usr, err := user.LookupId(u)
	if err != nil {
		if usr, err = user.Lookup(u); err != nil {
			return cred.Cred{}, err
		}
	}
	uid, err := strconv.ParseUint(usr.Uid, 10, 32)
	if err != nil {
		return cred.Cred{}, err
	}
	gid, err := strconv.ParseUint(usr.Gid, 10, 32)
	if err != nil {
		return cred.Cred{}, err
	}
	c := cred.Cred{UID: uint32(uid), GID: uint32(gid)}
	gs, err := usr.GroupIds()
	if err != nil {
		return cred.Cred{}, err
	}
	for _, g := range gs {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil {
			c.Groups = append(c.Groups, uint32(n))
		}
	}
	return c, nil
}

func backendNames() []string {
	var names []string
	for _, s := range loader.Backends() {
		names = append(names, s.Name)
	}
	return names
}

// backendFlags defines one flag per backend option (named after the
// option, '_' as '-'), documented from every backend that has it, and
// returns the map the given ones are collected in, by option name.
func backendFlags(fs *flag.FlagSet) map[string]any {
	given := map[string]any{}
	type use struct {
		opt  backend.Option
		docs []string
	}
	var order []string
	uses := map[string]*use{}
	for _, spec := range loader.Backends() {
		for _, o := range spec.Options {
			u := uses[o.Name]
			if u == nil {
				u = &use{opt: o}
				uses[o.Name] = u
				order = append(order, o.Name)
			}
			u.docs = append(u.docs, fmt.Sprintf("%s: default %v", spec.Name, o.Default))
		}
	}
	for _, name := range order {
		u := uses[name]
		doc := fmt.Sprintf("%s (%s)", u.opt.Doc, strings.Join(u.docs, "; "))
		set := func(v string) error { given[name] = v; return nil }
		if u.opt.Kind == backend.Bool {
			fs.BoolFunc(u.opt.Flag(), doc, set)
		} else {
			fs.Func(u.opt.Flag(), doc, set)
		}
	}
	return given
}

// addCUDALibDirFlag adds --cuda-lib-dir. Its returned function checks the directory.
// It sets NVFEED_CUDA_LIB_DIR, which discovery looks at first.
func addCUDALibDirFlag(fs *flag.FlagSet) func() error {
	dir := fs.String("cuda-lib-dir", "", "look for libcudart and libcufile in DIR first (sets "+cuda.EnvLibDir+"); then the NVIDIA wheels of $VIRTUAL_ENV, $CONDA_PREFIX and the system's Python, $CUDA_HOME/lib64, /usr/local/cuda/lib64, the dynamic loader's search")
	return func() error {
		if *dir == "" {
			return nil
		}
		if st, err := os.Stat(*dir); err != nil || !st.IsDir() {
			return cli.UsageErr(fs, "--cuda-lib-dir %q: not a directory", *dir)
		}
		return os.Setenv(cuda.EnvLibDir, *dir)
	}
}

// logCUDA loads the daemon's CUDA libraries once at start and logs where and which versions.
func logCUDA(log *slog.Logger, libs *cuda.Libs) {
	rt, err := libs.OpenRuntime()
	if err != nil {
		log.Info("loaderd: no CUDA runtime: memory gpu unavailable")
		return
	}
	var attrs []any
	if v, err := rt.RuntimeVersion(); err == nil {
		attrs = append(attrs, "runtime", cuda.FormatVersion(v))
	}
	if d, err := rt.DriverVersion(); err != nil {
		attrs = append(attrs, "driver", "none")
	} else {
		attrs = append(attrs, "driver", cuda.FormatVersion(d))
	}
	if c, err := libs.CuFile(); err == nil {
		if v, err := c.Version(); err == nil {
			attrs = append(attrs, "cufile", cuda.FormatCuFileVersion(v))
		}
	} else {
		attrs = append(attrs, "libcufile", "none")
	}
	log.Info("loaderd: CUDA versions", attrs...)
}

// checkCmd reports what this machine offers the loader; it succeeds
// without a GPU.
func checkCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd check", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	datasets := datasetFlags{}
	fs.Var(datasets, "dataset", "NAME=MAPFILE: check a dataset's device too (repeatable)")
	cudaLibDir := addCUDALibDirFlag(fs)
	if err := cli.Parse(fs, args, stdout, stderr, checkUsage); err != nil {
		return err
	}
	if err := cudaLibDir(); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageErr(fs, "unexpected argument %q", fs.Arg(0))
	}
	r, err := check.Run(check.Options{Datasets: datasets})
	if err != nil {
		return err
	}
	if *asJSON {
		return r.WriteJSON(stdout)
	}
	r.WriteText(stdout)
	return nil
}

// backendsCmd prints every backend with its options.
func backendsCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd backends", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the descriptions as JSON")
	if err := cli.Parse(fs, args, stdout, stderr, backendsUsage); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.UsageErr(fs, "unexpected argument %q", fs.Arg(0))
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(loader.Backends())
	}
	for _, spec := range loader.Backends() {
		def := ""
		if spec.Name == loader.DefaultBackend {
			def = " (default)"
		}
		fmt.Fprintf(stdout, "%s%s: %s\n", spec.Name, def, spec.Doc)
		for _, o := range spec.Options {
			limits := ""
			switch o.Kind {
			case backend.Int:
				limits = fmt.Sprintf(" [%d, %d]", o.Min, o.Max)
				if o.Multiple > 0 {
					limits += fmt.Sprintf(", multiple of %d", o.Multiple)
				}
			case backend.Enum:
				limits = " {" + strings.Join(o.Choices, "|") + "}"
			}
			fmt.Fprintf(stdout, "  --%-12s %-5s default %v%s: %s\n", o.Flag(), o.Kind, o.Default, limits, o.Doc)
		}
	}
	return nil
}

// startProfile writes a CPU profile to path until the returned stop.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile %s: %w", path, err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// datasetFlags collects repeated --dataset NAME=MAP flags.
type datasetFlags map[string]string

// String lists the datasets given.
func (d datasetFlags) String() string { return fmt.Sprint(map[string]string(d)) }

// Set adds one NAME=MAPFILE.
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

// idFlags collects repeated uid or gid flags, each a number or a
// comma-separated list of numbers.
type idFlags []uint32

// String lists the ids given.
func (d *idFlags) String() string { return fmt.Sprint([]uint32(*d)) }

// Set adds one id or a comma-separated list of them.
func (d *idFlags) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil || n == 1<<32-1 {
			return fmt.Errorf("want a number or a comma-separated list of numbers, got %q", v)
		}
		*d = append(*d, uint32(n))
	}
	return nil
}

// serveTestFlags adds the flags of a test build to loaderd serve's:
// --inject-eio in a build with -tags nvfeed_faults (faults.go); nil in a
// release build, which has none.
var serveTestFlags func(fs *flag.FlagSet)

func serveCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd serve", flag.ContinueOnError)
	config := fs.String("config", "", "read settings from FILE: one flag per line, KEY = VALUE, as on the command line without the dashes; flags given on the command line win")
	socket := fs.String("socket", "", "unix socket to listen on (required; its directory is created, mode 0755, if missing); ready when it exists")
	listen := fs.String("listen", "", "also listen on this loopback TCP address, e.g. 127.0.0.1:7070 (needs --tcp-token)")
	tokenFile := fs.String("tcp-token", "", "FILE holding the bearer token every TCP request must carry (Authorization: Bearer TOKEN)")
	sockGroup := fs.String("socket-group", "", "group (name or gid) whose members may connect to the socket (default: the daemon's group, root's as a service: only root can connect, and loaderd warns so)")
	sockMode := fs.String("socket-mode", "0660", "the socket's permission bits, octal")
	tcpUser := fs.String("tcp-user", serve.DefaultTCPUser, "the user (name or uid) TCP callers are judged as: the datasets it may read, and the owner of their sessions (which unix-socket callers cannot reach, nor they a unix caller's)")
	timeout := fs.Duration("session-timeout", session.DefaultSessionTimeout, "close sessions idle for longer than this")
	maxMem := fs.Int64("max-session-mb", session.DefaultMaxSessionBytes>>20, "refuse sessions needing more batch memory than this (MiB)")
	maxSessions := fs.Int("max-sessions", session.DefaultMaxSessions, "refuse new sessions while this many are open (429)")
	maxPerUID := fs.Int("max-sessions-per-uid", session.DefaultMaxSessionsPerUID, "refuse a uid's new sessions while it has this many open (429; TCP callers count as one uid)")
	maxChecks := fs.Int("max-checks-per-uid", session.DefaultMaxChecksPerUID, "run at most this many of a uid's whole-dataset access checks at once (a listing's, or a refusal's that names what only readers know: each opens the dataset's samples as the caller, every one the first time, then those changed since); the others wait their turn")
	maxReplays := fs.Int("max-replays-per-uid", session.DefaultMaxReplaysPerUID(), "run at most this many of a uid's shuffle dali replays at once (a session resumed or moved to an epoch goes through every epoch before it again: up to tens of seconds of a core); the others wait their turn")
	maxLocked := fs.Int64("max-locked-mb", 0, fmt.Sprintf("refuse sessions whose batch memory would take all open sessions' past this (MiB; 507); 0: %.0f%% of the machine's memory, no more than the memory cgroup's limit leaves (less %d MiB or %.1f%% of it for the daemon itself, and the sample-order budget), within RLIMIT_MEMLOCK unless the daemon has CAP_IPC_LOCK", session.DefaultLockedShare*100, session.MinDaemonReserve>>20, session.DaemonReserveShare*100))
	maxLockedUID := fs.Int64("max-locked-mb-per-uid", 0, "refuse a uid's sessions whose batch memory would take its open sessions' past this (MiB; 507), so that no uid starves the others; 0: half of --max-locked-mb's budget")
	maxDevice := fs.Int64("max-device-mb", session.DefaultMaxDeviceBytes>>20, "refuse GPU sessions whose GPU batch memory (slots rounded up to 2 MiB) would take all open sessions' on every GPU together past this (MiB; 507)")
	maxSampler := fs.Int64("max-sampler-mb", 0, fmt.Sprintf("refuse sessions whose sample order (a listed order: stick_to_shard's, a resumed old state's permutation; shuffle dali's file list and initial_fill buffer) would take all open sessions' past this (MiB; 507); 0: %.1f%% of the machine's memory, or of what the memory cgroup's limit leaves the budgets", session.DefaultSamplerShare*100))
	maxConns := fs.Int("max-conns-per-uid", serve.DefaultMaxConnsPerUID, "answer a uid's connections past this many open with 429 and close them (TCP clients count as one uid)")
	maxConnsAll := fs.Int("max-conns", 0, "answer connections past this many open, all users together, with 429 and close them (0: what RLIMIT_NOFILE leaves after the sessions and the daemon)")
	rootConns := fs.Int("root-conns", serve.DefaultRootConns, "keep this many of --max-conns for root (uid 0 on the unix socket)")
	readTimeout := fs.Duration("read-timeout", serve.DefaultReadTimeout, "close a connection whose request (headers and body) takes longer than this to arrive")
	writeTimeout := fs.Duration("write-timeout", serve.DefaultWriteTimeout, "bound each response (a next's wait for its batch included) and each frame of a stream")
	idleTimeout := fs.Duration("idle-timeout", serve.DefaultIdleTimeout, "close keep-alive connections idle between requests for longer than this")
	streamIdle := fs.Duration("stream-idle-timeout", serve.DefaultStreamIdleTimeout, "close a batch stream with no frame either way for longer than this (at least --session-timeout)")
	engines := fs.String("engines", session.EnginesPerSession, "raw engines (io_uring rings) per session, or per device: shared by the sessions reading it")
	if serveTestFlags != nil {
		serveTestFlags(fs)
	}
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the daemon's run to FILE (until it stops)")
	datasets := datasetFlags{}
	fs.Var(datasets, "dataset", "NAME=MAPFILE: register a dataset (repeatable, at least one); SIGHUP or loaderd reload reads the files again")
	var trustedUIDs, trustedGIDs idFlags
	fs.Var(&trustedUIDs, "trusted-uid", "UID[,UID...]: users besides root whose files may be read raw (repeatable); a raw-mapped sample another user may change (owner, mode, ACL; not immutable) is read through the filesystem")
	fs.Var(&trustedGIDs, "trusted-gid", "GID[,GID...]: groups whose write permission on a sample still lets it be read raw (repeatable; default none)")
	checkBefore := fs.Bool("check-before-ready", false, "check every raw sample (identity, extents, who may change it) before serving; by default the daemon serves at once and reads each raw sample through the filesystem, as the caller, until the check that runs after start has passed it")
	cudaLibDir := addCUDALibDirFlag(fs)
	logs := addLogFlags(fs)
	if err := cli.Parse(fs, args, stdout, stderr, serveUsage); err != nil {
		return err
	}
	// What a reload reads: the command line's datasets, or else the
	// config file's dataset lines as they are then.
	cliDatasets := maps.Clone(datasets)
	if *config != "" {
		if err := applyConfig(fs, *config); err != nil {
			return cli.UsageErr(fs, "%v", err)
		}
	}
	if *socket == "" || len(datasets) == 0 {
		return cli.UsageErr(fs, "--socket and at least one --dataset are required")
	}
	if fs.NArg() > 0 {
		return cli.UsageErr(fs, "unexpected argument %q", fs.Arg(0))
	}
	if err := cudaLibDir(); err != nil {
		return err
	}
	log, err := useLogger(fs, logs, stderr)
	if err != nil {
		return err
	}
	have, err := caps.Current()
	if err != nil {
		return fmt.Errorf("loaderd serve: %w", err)
	}
	if err := checkCaps(have.Effective, os.Geteuid(), capNeeds(*sockGroup), log); err != nil {
		return err
	}
	if *cpuProfile != "" { // from here: loading the maps is part of the start-up it profiles
		stop, err := startProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	libs := cuda.NewLibs(cuda.SearchFromEnv(), log)
	logCUDA(log, libs)
	loaded, webs := map[string]*bmap.Map{}, map[string]*wds.Map{}
	for name, path := range datasets {
		m, w, err := session.LoadMap(path)
		if err != nil {
			return fmt.Errorf("dataset %s: %w", name, err)
		}
		if w != nil {
			webs[name] = w
		} else {
			loaded[name] = m
		}
	}
	if *engines != session.EnginesPerDevice && *engines != session.EnginesPerSession {
		return cli.UsageErr(fs, "--engines %q: want %s or %s", *engines, session.EnginesPerDevice, session.EnginesPerSession)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"max-sessions", int64(*maxSessions)}, {"max-sessions-per-uid", int64(*maxPerUID)}, {"max-conns-per-uid", int64(*maxConns)}, {"max-session-mb", *maxMem}, {"max-device-mb", *maxDevice}, {"max-replays-per-uid", int64(*maxReplays)}, {"max-checks-per-uid", int64(*maxChecks)}} {
		if f.v < 1 {
			return cli.UsageErr(fs, "--%s %d: want at least 1", f.name, f.v)
		}
	}
	if *maxLockedUID < 0 {
		return cli.UsageErr(fs, "--max-locked-mb-per-uid %d: want 0 (the default) or more", *maxLockedUID)
	}
	if *maxLocked < 0 {
		return cli.UsageErr(fs, "--max-locked-mb %d: want 0 (the default) or more", *maxLocked)
	}
	if *maxSampler < 0 {
		return cli.UsageErr(fs, "--max-sampler-mb %d: want 0 (the default) or more", *maxSampler)
	}
	if *maxConnsAll < 0 {
		return cli.UsageErr(fs, "--max-conns %d: want 0 (the default) or more", *maxConnsAll)
	}
	if *rootConns < 0 {
		return cli.UsageErr(fs, "--root-conns %d: want 0 or more", *rootConns)
	}
	if *rootConns == 0 {
		*rootConns = -1 // serve.Listen's "none"
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"session-timeout", *timeout}, {"read-timeout", *readTimeout}, {"write-timeout", *writeTimeout}, {"idle-timeout", *idleTimeout}, {"stream-idle-timeout", *streamIdle}} {
		if f.v <= 0 {
			return cli.UsageErr(fs, "--%s %s: want a positive duration", f.name, f.v)
		}
	}
	mode, err := strconv.ParseUint(*sockMode, 8, 32)
	if err != nil || mode > 0o777 {
		return cli.UsageErr(fs, "--socket-mode %q: want octal permission bits such as 0660", *sockMode)
	}
	if *sockGroup == "" && mode&0o007 == 0 {
		log.Warn(rootOnlySocket(os.Geteuid(), os.Getegid(), *socket), "socket", *socket, "mode", fmt.Sprintf("%04o", mode))
	}
	var token string
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--tcp-token: %w", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return fmt.Errorf("--tcp-token: %s is empty", *tokenFile)
		}
	}
	mapFiles := func() (map[string]string, error) {
		if len(cliDatasets) > 0 || *config == "" {
			return maps.Clone(cliDatasets), nil
		}
		return configDatasets(*config)
	}
	srv := serve.New(serve.Config{Datasets: loaded, WebDatasets: webs, MapFiles: mapFiles, SessionTimeout: *timeout, MaxSessionBytes: *maxMem << 20, MaxSessions: *maxSessions,
		MaxSessionsPerUID: *maxPerUID, MaxLockedBytes: *maxLocked << 20, MaxLockedPerUID: *maxLockedUID << 20, MaxDeviceBytes: *maxDevice << 20, MaxSamplerBytes: *maxSampler << 20, MaxReplaysPerUID: *maxReplays, MaxChecksPerUID: *maxChecks, Engines: *engines, Logger: log, CUDA: libs,
		Trust: fresh.Trust{UIDs: trustedUIDs, GIDs: trustedGIDs}, CheckInBackground: !*checkBefore, Release: version})
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			srv.Reload() // logs what it did
		}
	}()
	err = srv.Run(ctx, serve.Listen{Socket: *socket, Mode: os.FileMode(mode), Group: *sockGroup, TCP: *listen, Token: token, TCPUser: *tcpUser,
		MaxConnsPerUID: *maxConns, MaxConns: *maxConnsAll, RootConns: *rootConns, ReadTimeout: *readTimeout, WriteTimeout: *writeTimeout, IdleTimeout: *idleTimeout, StreamIdleTimeout: *streamIdle})
	if errors.Is(err, serve.ErrNoToken) {
		return fmt.Errorf("%w: give --tcp-token FILE with --listen", err)
	}
	return err
}

// reloadCmd asks the running daemon to read its maps again and prints
// what became of each dataset.
func reloadCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loaderd reload", flag.ContinueOnError)
	cf := addClientFlags(fs, 10*time.Minute, " (a reload stats every raw sample again)")
	path, err := cf.parse(fs, args, stdout, stderr, reloadUsage)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *cf.timeout)
	defer cancel()
	res, err := serve.RequestReload(ctx, path)
	if err != nil {
		return err
	}
	failed := 0
	for _, r := range res.Datasets {
		switch r.Outcome {
		case session.ReloadFailed:
			failed++
			fmt.Fprintf(stdout, "%s: %s, serving %d samples as before: %s\n", r.Dataset, r.Outcome, r.Samples, r.Error)
		case session.ReloadRemoved:
			fmt.Fprintf(stdout, "%s: %s\n", r.Dataset, r.Outcome)
		default:
			fmt.Fprintf(stdout, "%s: %s, %d samples\n", r.Dataset, r.Outcome, r.Samples)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d maps did not load: those datasets are served as before", failed, len(res.Datasets))
	}
	return nil
}

// clientFlags are the flags of the commands that ask the running daemon
// (reload, status): where its socket is and how long to wait.
type clientFlags struct {
	socket, config *string
	timeout        *time.Duration
}

// addClientFlags defines --socket, --config and --timeout (default
// timeout; why is said after it) on fs.
func addClientFlags(fs *flag.FlagSet, timeout time.Duration, why string) clientFlags {
	return clientFlags{
		socket:  fs.String("socket", "", "the daemon's unix socket (default: the config file's socket, else "+defaultSocket+")"),
		config:  fs.String("config", "", "the daemon's config file: its socket line names the socket"),
		timeout: fs.Duration("timeout", timeout, "give up waiting for the daemon after this"+why),
	}
}

// parse parses args (no positional one) and returns the daemon's socket:
// --socket, else the config file's socket line, else defaultSocket.
func (c clientFlags) parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, usage string) (string, error) {
	if err := cli.Parse(fs, args, stdout, stderr, usage); err != nil {
		return "", err
	}
	if fs.NArg() > 0 {
		return "", cli.UsageErr(fs, "unexpected argument %q", fs.Arg(0))
	}
	if *c.socket == "" && *c.config != "" {
		s, err := configValue(*c.config, "socket")
		if err != nil {
			return "", err
		}
		return s, nil
	}
	if *c.socket == "" {
		return defaultSocket, nil
	}
	return *c.socket, nil
}
