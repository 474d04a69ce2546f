// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
	"github.com/nvfeed/nvfeed/extentinfo"
	"github.com/nvfeed/nvfeed/internal/testenv"
	"github.com/nvfeed/nvfeed/internal/testfs"
	"github.com/nvfeed/nvfeed/loader"
)

// The attacker's tests: a real daemon on a real socket, a real ext4 on a
// loop device, and clients that connect as other users (nobody, a user
// whose groups differ from the user database), trying to read what the
// filesystem refuses them. docs/security.md lists the promise each one
// checks.

const nobodyID = 65534

// secret is the pattern of every file the attacker must never see.
var secret = []byte("SECRET!!")

// attackFS is an ext4 with a dataset readable by all at root (classes
// c0, c1; 4 samples each) and a root-only vault beside it.
type attackFS struct {
	fs    *testfs.FS
	root  string
	vault string
}

func newAttackFS(t *testing.T) *attackFS {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipPrivileged(t, "serve: attacker tests connect as other users (euid %d)", os.Geteuid())
	}
	fs := testfs.New(t, testfs.Ext4())
	// The mount point and its temporary parents are 0700: others must be
	// able to reach the dataset for the tests to mean anything.
	for d := fs.Dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	a := &attackFS{fs: fs, root: fs.Path("data"), vault: fs.Path("vault")}
	for c := 0; c < 2; c++ {
		for i := 0; i < 4; i++ {
			body := bytes.Repeat([]byte(fmt.Sprintf("SAMPLE-%d-%d|", c, i)), 600+97*i)
			fs.WriteFile(t, fmt.Sprintf("data/c%d/%03d.jpg", c, i), body)
		}
	}
	fs.WriteFile(t, "vault/public.jpg", bytes.Repeat([]byte("VAULT-PUBLIC"), 500))
	os.Chmod(a.vault, 0o700)
	return a
}

// writeSecret writes a 0600 root file of size bytes of the secret
// pattern at rel (under the mount point).
func (a *attackFS) writeSecret(t *testing.T, rel string, size int) string {
	t.Helper()
	p := a.fs.Path(rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	b := bytes.Repeat(secret, size/len(secret)+1)[:size]
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	a.fs.Sync(t)
	return p
}

func (a *attackFS) size(t *testing.T, rel string) int {
	fi, err := os.Stat(filepath.Join(a.root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Size())
}

// build maps the dataset as root does with mkbmap.
func (a *attackFS) build(t *testing.T) *bmap.Map {
	t.Helper()
	a.fs.Sync(t)
	m, err := bmap.Build(context.Background(), a.root, bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// daemon serves m as "ds" on a socket anyone may connect to.
func daemon(t *testing.T, m *bmap.Map) string {
	t.Helper()
	return daemonWith(t, Config{Datasets: map[string]*bmap.Map{"ds": m}, SessionTimeout: time.Minute})
}

// daemonWith serves cfg on a socket anyone may connect to.
func daemonWith(t *testing.T, cfg Config) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	sock := filepath.Join(dir, "d.sock")
	srv := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, Listen{Socket: sock, Mode: 0o666}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	for i := 0; i < 400; i++ {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the daemon's socket never appeared")
	return ""
}

// who is a client identity: the credentials its process connects with.
type who struct {
	uid, gid uint32
	groups   []uint32
}

var nobodyWho = who{nobodyID, nobodyID, nil}

// peerClient is an HTTP client of the daemon whose connections are made as w.
type peerClient struct {
	t    *testing.T
	sock string
	w    who
	c    *client
}

func connectAs(t *testing.T, sock string, w who) *peerClient {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return testenv.DialUnixAs(sock, w.uid, w.gid, w.groups)
	}}}
	t.Cleanup(hc.CloseIdleConnections)
	return &peerClient{t: t, sock: sock, w: w, c: &client{http: hc, base: "http://d"}}
}

// call makes a request and returns its status and, for a refusal, the
// daemon's message.
func (c *peerClient) call(method, path string, body, out any) (int, string) {
	c.t.Helper()
	code, raw := c.c.call(c.t, method, path, body, out)
	if code != http.StatusOK {
		var e wire.ErrorResponse
		msgpack.Unmarshal(raw, &e)
		return code, e.Error
	}
	return code, ""
}

// attackSession is an open session and its mapped batch memory.
type attackSession struct {
	c   *peerClient
	id  string
	mem []byte
}

// open opens a session over "ds" with backend be; code and message are
// the refusal, if any.
func (c *peerClient) open(be string) (*attackSession, int, string) {
	c.t.Helper()
	var o wire.OpenResponse
	code, msg := c.call("POST", "/v1/sessions", wire.OpenRequest{Dataset: "ds", Request: loader.Request{Backend: be, ReaderArgs: loader.ReaderArgs{BatchSize: 4, NumShards: 1}}}, &o)
	if code != http.StatusOK {
		return nil, code, msg
	}
	conn, err := testenv.DialUnixAs(c.sock, c.w.uid, c.w.gid, c.w.groups)
	if err != nil {
		c.t.Fatal(err)
	}
	mr, fd, err := receiveMemoryOn(conn, o.ID)
	if err != nil {
		c.t.Fatalf("memory: %v", err)
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(fd, 0, int(mr.Memory.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { unix.Munmap(mem) })
	return &attackSession{c: c, id: o.ID, mem: mem}, code, ""
}

// epoch reads one epoch, releasing each batch at the next, and returns
// every sample's bytes by path (failed ones: nil) and the failures'
// messages. After every batch it scans the whole batch memory for the
// secret.
func (s *attackSession) epoch(m *bmap.Map) (got map[string][]byte, failed []string) {
	t := s.c.t
	t.Helper()
	got = map[string][]byte{}
	var rel []int
	for {
		var nb wire.NextResponse
		if code, msg := s.c.call("POST", "/v1/sessions/"+s.id+"/next", wire.NextRequest{Release: rel}, &nb); code != http.StatusOK {
			t.Fatalf("next: %d %s", code, msg)
		}
		if i := bytes.Index(s.mem, secret); i >= 0 {
			t.Fatalf("the secret is in the client's batch memory at offset %d (batch %d.%d)", i, nb.Epoch, nb.Iteration)
		}
		if nb.EndOfEpoch {
			return got, failed
		}
		rel = []int{nb.Slot}
		for i, idx := range nb.Indices {
			p := m.Samples[idx].Path
			got[p] = append([]byte(nil), s.mem[nb.Offsets[i]:nb.Offsets[i]+nb.Lengths[i]]...)
		}
		for j, pos := range nb.Failed {
			got[m.Samples[nb.Indices[pos]].Path] = nil
			failed = append(failed, nb.Errors[j])
		}
	}
}

// refusedAs returns "" if c, opening a session over m with backend be,
// is refused the samples rels (paths under the root) and served the rest:
// with none, it opens and serves every sample; with some, the open is
// 403 for a permission, or (samples are checked as they are
// first read) it opens and an epoch fails exactly those samples, each
// failure saying "permission denied", none of their bytes delivered and
// never (their content; nil: not checked) nowhere in the batch memory
// after the epoch; else what went otherwise.
func (c *peerClient) refusedAs(m *bmap.Map, be string, never []byte, rels ...string) string {
	c.t.Helper()
	s, code, msg := c.open(be)
	switch {
	case code == http.StatusForbidden && strings.Contains(msg, "permission denied") && len(rels) > 0:
		return ""
	case code != http.StatusOK:
		return fmt.Sprintf("open: %d %q", code, msg)
	}
	got, failed := s.epoch(m)
	var why []string
	for _, rel := range rels {
		if b, ok := got[rel]; !ok || b != nil {
			why = append(why, fmt.Sprintf("%s served (%d bytes)", rel, len(b)))
		}
	}
	if i := bytes.Index(s.mem, never); len(never) > 0 && i >= 0 {
		why = append(why, fmt.Sprintf("the refused samples' bytes are in the batch memory at %d", i))
	}
	if len(failed) != len(rels) {
		why = append(why, fmt.Sprintf("%d samples failed, want %d: %q", len(failed), len(rels), failed))
	}
	for _, f := range failed {
		if !strings.Contains(f, "permission denied") {
			why = append(why, fmt.Sprintf("a failure that is not a refusal: %q", f))
		}
	}
	for rel, b := range got {
		if b == nil && !slices.Contains(rels, rel) {
			why = append(why, fmt.Sprintf("%s, readable, failed", rel))
		}
	}
	return strings.Join(why, "; ")
}

// readingAsNobody opens a session as nobody with backend be and reads a
// first epoch of m, which must have no failed sample.
func readingAsNobody(t *testing.T, sock string, m *bmap.Map, be string) *attackSession {
	t.Helper()
	s, code, msg := connectAs(t, sock, nobodyWho).open(be)
	if code != http.StatusOK {
		t.Fatalf("%s: open as nobody: %d %s", be, code, msg)
	}
	if _, failed := s.epoch(m); len(failed) != 0 {
		t.Fatalf("%s: before any change: %v", be, failed)
	}
	return s
}

// TestAttackSymlinkedDataset: samples, class directories or the root that
// are symlinks into a directory the caller cannot search are refused,
// although the files they lead to are readable by all: the root at the
// open (403), samples as they are read (each failed, named, no byte of
// it in the batch memory).
func TestAttackSymlinkedDataset(t *testing.T) {
	for _, tc := range []struct {
		name    string
		link    func(a *attackFS) string // makes the symlink; returns the dataset root to map
		refused []string                 // samples refused in the stream (none: the open is)
	}{
		{"sample", func(a *attackFS) string {
			os.Remove(filepath.Join(a.root, "c1/000.jpg"))
			os.Symlink(filepath.Join(a.vault, "public.jpg"), filepath.Join(a.root, "c1/000.jpg"))
			return a.root
		}, []string{"c1/000.jpg"}},
		{"class directory", func(a *attackFS) string {
			os.Rename(filepath.Join(a.root, "c1"), filepath.Join(a.vault, "c1"))
			os.Symlink(filepath.Join(a.vault, "c1"), filepath.Join(a.root, "c1"))
			return a.root
		}, []string{"c1/000.jpg", "c1/001.jpg", "c1/002.jpg", "c1/003.jpg"}},
		{"root", func(a *attackFS) string {
			os.Rename(a.root, filepath.Join(a.vault, "data"))
			link := a.fs.Path("linked")
			os.Symlink(filepath.Join(a.vault, "data"), link)
			return link
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAttackFS(t)
			a.root = tc.link(a)
			m := a.build(t)
			sock := daemon(t, m)
			c := connectAs(t, sock, nobodyWho)
			for _, be := range []string{"file", "gds", "bam"} {
				if tc.refused == nil {
					if _, code, msg := c.open(be); code != http.StatusForbidden || !strings.Contains(msg, "permission denied") {
						t.Errorf("%s: open as nobody: %d %q, want 403 naming the refused path", be, code, msg)
					}
				} else if why := c.refusedAs(m, be, []byte("VAULT-PUBLIC"), tc.refused...); why != "" {
					t.Errorf("%s: as nobody: %s", be, why)
				}
			}
			// The same dataset's owner (root) is served.
			if _, code, msg := connectAs(t, sock, who{0, 0, nil}).open("gds"); code != http.StatusOK {
				t.Errorf("open as root: %d %s", code, msg)
			}
		})
	}
}

// TestAttackSwapMidSession: while nobody's session runs, a user who can
// write a class directory replaces samples: with a symlink to a root-only
// file (same size, and another size), and with a 0600 file renamed into
// place. Those samples fail; the root-only bytes never reach the client's
// memory; the untouched samples are still served exactly.
func TestAttackSwapMidSession(t *testing.T) {
	for _, be := range []string{"file", "gds", "bam"} {
		t.Run(be, func(t *testing.T) {
			a := newAttackFS(t)
			m := a.build(t)
			sock := daemon(t, m)
			s := readingAsNobody(t, sock, m, be)
			same := a.writeSecret(t, "vault/same", a.size(t, "c1/000.jpg"))
			other := a.writeSecret(t, "vault/other", a.size(t, "c1/001.jpg")+3000)
			os.Chmod(a.vault, 0o755) // the files themselves are what refuse nobody now
			swap := map[string]func(string){
				"c1/000.jpg": func(p string) { os.Remove(p); os.Symlink(same, p) },
				"c1/001.jpg": func(p string) { os.Remove(p); os.Symlink(other, p) },
				"c1/002.jpg": func(p string) {
					tmp := filepath.Join(filepath.Dir(p), ".new")
					os.WriteFile(tmp, bytes.Repeat(secret, 100), 0o600)
					os.Rename(tmp, p)
				},
			}
			for rel, do := range swap {
				do(filepath.Join(a.root, rel))
			}
			a.fs.Sync(t)
			for e := 0; e < 3; e++ { // batches read ahead before the swap may hold the old bytes: still the file's
				got, failed := s.epoch(m)
				for rel := range swap {
					if e > 0 && got[rel] != nil {
						t.Errorf("epoch %d: %s, swapped, was served (%d bytes)", e, rel, len(got[rel]))
					}
				}
				if e > 0 && len(failed) != len(swap) {
					t.Errorf("epoch %d: %d failed samples, want %d: %v", e, len(failed), len(swap), failed)
				}
				want, _ := os.ReadFile(filepath.Join(a.root, "c0/001.jpg"))
				if !bytes.Equal(got["c0/001.jpg"], want) {
					t.Errorf("epoch %d: an untouched sample differs from its file", e)
				}
			}
		})
	}
}

// TestAttackForgedMap: a map written by the user (mkbmap needs no root)
// that points the user's own sample at another file's blocks. The daemon
// checks extents against FIEMAP before any raw read: the sample is read
// through the filesystem (its own bytes), the other file's never.
func TestAttackForgedMap(t *testing.T) {
	a := newAttackFS(t)
	p := a.writeSecret(t, "vault/secret", 64<<10)
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	var mp extentinfo.Mapper
	exts, err := mp.Extents(f)
	f.Close()
	if err != nil || len(exts) == 0 {
		t.Fatalf("FIEMAP of the secret: %v %v", exts, err)
	}
	m := a.build(t)
	victim := &m.Samples[0]
	victim.Extents = []extentinfo.Extent{{Logical: 0, Physical: exts[0].Physical, Length: uint64(backendAlign(victim.Size))}}
	// Written by nobody, loaded by the daemon.
	mapPath := filepath.Join(t.TempDir(), "forged.bmap")
	if _, err := bmap.WriteFile(mapPath, m, bmap.FormatBinary); err != nil {
		t.Fatal(err)
	}
	os.Chown(mapPath, nobodyID, nobodyID)
	forged, err := bmap.Load(mapPath)
	if err != nil {
		t.Fatal(err)
	}
	sock := daemon(t, forged)
	for _, be := range []string{"gds", "bam"} {
		s, code, msg := connectAs(t, sock, nobodyWho).open(be)
		if code != http.StatusOK {
			t.Fatalf("%s: open as nobody: %d %s", be, code, msg)
		}
		got, failed := s.epoch(forged)
		want, _ := os.ReadFile(filepath.Join(a.root, victim.Path))
		if !bytes.Equal(got[victim.Path], want) || len(failed) != 0 {
			t.Errorf("%s: the forged sample: %d bytes, equal to its file: %v; failures %v", be, len(got[victim.Path]), bytes.Equal(got[victim.Path], want), failed)
		}
	}
}

func backendAlign(n int64) int64 { return (n + 4095) &^ 4095 }

// TestAttackGroups: groups are the caller's process's, not the user
// database's: a group the database lists but the process dropped grants
// nothing; a group the process has that the database does not list does.
func TestAttackGroups(t *testing.T) {
	a := newAttackFS(t)
	victim := filepath.Join(a.root, "c0/002.jpg")
	pg, err := user.Lookup("postgres") // in group ssl-cert (103) in /etc/group
	dbGroup := 103
	if err != nil {
		testenv.SkipPrivileged(t, "no user postgres (a member of ssl-cert in /etc/group) to test a dropped group: %v", err)
	}
	uid, _ := strconv.Atoi(pg.Uid)
	gid, _ := strconv.Atoi(pg.Gid)
	os.Chown(victim, 0, dbGroup)
	os.Chmod(victim, 0o640)
	m := a.build(t)
	sock := daemon(t, m)
	for _, tc := range []struct {
		name    string
		w       who
		refused []string // the victim, or nothing
	}{
		{"listed in /etc/group, dropped by the process", who{uint32(uid), uint32(gid), nil}, []string{"c0/002.jpg"}},
		{"listed and kept", who{uint32(uid), uint32(gid), []uint32{uint32(dbGroup)}}, nil},
		{"not in /etc/group, held by the process", who{nobodyID, nobodyID, []uint32{uint32(dbGroup)}}, nil},
		{"neither", nobodyWho, []string{"c0/002.jpg"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if why := connectAs(t, sock, tc.w).refusedAs(m, "gds", nil, tc.refused...); why != "" {
				t.Errorf("%s", why)
			}
		})
	}
}

// TestAttackRevokedMidSession: while nobody reads, the owner takes access
// away: a class directory becomes 0700, a file 0600, a class directory is
// swapped for a symlink into a directory nobody cannot search. From then
// on those samples fail for every backend (the daemon re-checks as the
// caller what the watch saw change), and the rest is still served.
func TestAttackRevokedMidSession(t *testing.T) {
	for _, be := range []string{"file", "gds", "bam"} {
		t.Run(be, func(t *testing.T) {
			a := newAttackFS(t)
			os.MkdirAll(filepath.Join(a.root, "c2"), 0o755)
			for i := 0; i < 4; i++ {
				a.fs.WriteFile(t, fmt.Sprintf("data/c2/%03d.jpg", i), bytes.Repeat([]byte("C2"), 3000+i))
			}
			m := a.build(t)
			sock := daemon(t, m)
			s := readingAsNobody(t, sock, m, be)
			os.Chmod(filepath.Join(a.root, "c1"), 0o700)
			os.Chmod(filepath.Join(a.root, "c0/001.jpg"), 0o600)
			os.Rename(filepath.Join(a.root, "c2"), filepath.Join(a.vault, "c2"))
			os.Symlink(filepath.Join(a.vault, "c2"), filepath.Join(a.root, "c2"))
			revoked := func(p string) bool {
				return strings.HasPrefix(p, "c1/") || strings.HasPrefix(p, "c2/") || p == "c0/001.jpg"
			}
			for e := 0; e < 3; e++ { // batches read ahead before the change were readable then
				got, _ := s.epoch(m)
				for _, smp := range m.Samples {
					switch b := got[smp.Path]; {
					case e > 0 && revoked(smp.Path) && b != nil:
						t.Errorf("epoch %d: %s, no longer readable by nobody, was served", e, smp.Path)
					case !revoked(smp.Path):
						want, _ := os.ReadFile(filepath.Join(a.root, smp.Path))
						if !bytes.Equal(b, want) {
							t.Errorf("epoch %d: %s differs from its file", e, smp.Path)
						}
					}
				}
			}
		})
	}
}
