// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// throwawayUID is a uid no account has: the sample owner in the tests.
const throwawayUID = 43117

// neverOpened is a throwaway uid that opens only after a revocation.
const neverOpened = throwawayUID + 1

// shellAs runs a shell command as uid (its own gid, no groups): a real
// process of that user, as an attacker would run it.
func shellAs(t *testing.T, uid uint32, script string) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as uid %d: %s: %v: %s", uid, script, err, out)
	}
}

// TestAttackRevokedAboveRoot: nobody has opened the dataset (200, every
// byte served); then root takes access away above the dataset root — a
// chmod 0700 of the root's parent, an ACL entry denying nobody on the
// parent, on the grandparent (and one denying the user who never opened).
// nobody's next open is 403 for every
// backend, as is that of a user who never opened it. Before, the verdict
// cached at the first open lived until an event under the root: 200 and
// all the bytes.
func TestAttackRevokedAboveRoot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		revoke func(t *testing.T, a *attackFS) string // returns the directory changed
	}{
		{"chmod 0700 parent", func(t *testing.T, a *attackFS) string {
			d := filepath.Dir(a.root)
			if err := os.Chmod(d, 0o700); err != nil {
				t.Fatal(err)
			}
			return d
		}},
		{"ACL deny on parent", func(t *testing.T, a *attackFS) string {
			d := filepath.Dir(a.root)
			setfacl(t, d)
			return d
		}},
		{"ACL deny on grandparent", func(t *testing.T, a *attackFS) string {
			d := filepath.Dir(filepath.Dir(a.root))
			setfacl(t, d)
			return d
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAttackFS(t)
			m := a.build(t)
			sock := daemon(t, m)
			for _, be := range []string{"file", "gds", "bam"} {
				readingAsNobody(t, sock, m, be)
			}
			d := tc.revoke(t, a)
			t.Cleanup(func() { os.Chmod(d, 0o755); exec.Command("setfacl", "-b", d).Run() })
			for _, be := range []string{"file", "gds", "bam"} {
				if s, code, msg := connectAs(t, sock, nobodyWho).open(be); code != http.StatusForbidden {
					got := 0
					if s != nil {
						g, _ := s.epoch(m)
						for _, b := range g {
							got += len(b)
						}
					}
					t.Errorf("%s: nobody's open after %s: %d %q (%d bytes served), want 403", be, tc.name, code, msg, got)
				}
			}
			never := who{neverOpened, neverOpened, nil}
			if _, code, msg := connectAs(t, sock, never).open("gds"); code != http.StatusForbidden {
				t.Errorf("a user who never opened: %d %q, want 403", code, msg)
			}
			// Root is still served.
			if _, code, msg := connectAs(t, sock, who{0, 0, nil}).open("gds"); code != http.StatusOK {
				t.Errorf("root: %d %s", code, msg)
			}
		})
	}
}

// setfacl adds entries denying nobody and the user who never opened
// everything on d.
func setfacl(t *testing.T, d string) {
	t.Helper()
	if out, err := exec.Command("setfacl", "-m", fmt.Sprintf("u:%d:---,u:%d:---", nobodyID, neverOpened), d).CombinedOutput(); err != nil {
		t.Fatalf("setfacl %s: %v: %s", d, err, out)
	}
}

// TestAttackChmodThroughOutsideLink: a throwaway uid owns a sample;
// nobody reads the dataset. The owner makes a hard link to the sample in
// a folder of theirs outside the dataset and changes the file only
// through it: no event in the dataset's directories.
//
// chmod 600 through the link: nobody's next session fails the sample
// (named; the open asks only the root) for every backend, and the
// session opened before fails it too (never its bytes). A rewrite through the link (truncate, new bytes): the session
// serves the new bytes or fails the sample, never the old blocks'
// content. Before, gds and bam kept serving the sample in both cases.
func TestAttackChmodThroughOutsideLink(t *testing.T) {
	const victim = "c1/002.jpg"
	for _, be := range []string{"file", "gds", "bam"} {
		for _, change := range []string{"chmod", "rewrite"} {
			t.Run(be+"/"+change, func(t *testing.T) {
				a := newAttackFS(t)
				home := a.fs.Path(fmt.Sprintf("home%d", throwawayUID))
				os.Mkdir(home, 0o700)
				os.Chown(home, throwawayUID, throwawayUID)
				p := filepath.Join(a.root, victim)
				os.Chown(p, throwawayUID, throwawayUID)
				old, _ := os.ReadFile(p)
				m := a.build(t)
				sock := daemon(t, m)
				s := readingAsNobody(t, sock, m, be)
				y := filepath.Join(home, "y")
				fresh := bytes.Repeat([]byte("NEWBYTES"), len(old)/8)
				switch change {
				case "chmod":
					shellAs(t, throwawayUID, fmt.Sprintf("ln %s %s && chmod 600 %s", p, y, y))
				case "rewrite":
					shellAs(t, throwawayUID, fmt.Sprintf("ln %s %s && : > %s && printf '%%s' '%s' > %s", p, y, y, fresh, y))
				}
				a.fs.Sync(t)
				for e := 0; e < 3; e++ { // batches read ahead before the change were readable then
					got, _ := s.epoch(m)
					b := got[victim]
					switch {
					case e == 0:
					case change == "chmod" && b != nil:
						t.Errorf("epoch %d: %s, 0600 through an outside link, was served (%d bytes)", e, victim, len(b))
					case change == "rewrite" && b != nil && !bytes.Equal(b, fresh):
						t.Errorf("epoch %d: %s, rewritten through an outside link: served %d bytes, not the new ones (old: %v)", e, victim, len(b), bytes.Equal(b, old))
					}
				}
				if change == "chmod" {
					if why := connectAs(t, sock, nobodyWho).refusedAs(m, be, old, victim); why != "" {
						t.Errorf("nobody's next session: %s", why)
					}
				}
			})
		}
	}
}

// TestAttackRevokedAboveALinkedClass: class c1 of the dataset is a
// symlink to a folder outside the root (root-owned, readable by all, so
// gds and bam read its samples raw). nobody reads the dataset; then root
// takes access away above where the link leads — a chmod 0700 or an ACL
// entry on the folder holding the target, or the folder moved into a
// 0700 one. No watch sees those folders (they are neither under the root
// nor above it). nobody's next session, and that of a user who never
// opened, must not get c1's bytes: a 403, or (the move: the path leads
// nowhere, which is a failed sample, not a refusal) its samples failed.
// Before, both got 200 and every byte from gds and bam, which read the
// unchanged inodes raw.
func TestAttackRevokedAboveALinkedClass(t *testing.T) {
	for _, tc := range []struct {
		name   string
		revoke func(t *testing.T, outside string) (undo func())
	}{
		{"chmod 0700 of the target's parent", func(t *testing.T, outside string) func() {
			if err := os.Chmod(outside, 0o700); err != nil {
				t.Fatal(err)
			}
			return func() { os.Chmod(outside, 0o755) }
		}},
		{"ACL deny on the target's parent", func(t *testing.T, outside string) func() {
			setfacl(t, outside)
			return func() { exec.Command("setfacl", "-b", outside).Run() }
		}},
		{"target's parent moved into a 0700 folder", func(t *testing.T, outside string) func() {
			private := filepath.Join(filepath.Dir(outside), "private")
			if err := os.Mkdir(private, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(outside, filepath.Join(private, "outside")); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAttackFS(t)
			outside := a.fs.Path("outside")
			if err := os.MkdirAll(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(a.root, "c1"), filepath.Join(outside, "c1")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(outside, "c1"), filepath.Join(a.root, "c1")); err != nil {
				t.Fatal(err)
			}
			m := a.build(t)
			sock := daemon(t, m)
			for _, be := range []string{"file", "gds", "bam"} {
				readingAsNobody(t, sock, m, be)
			}
			t.Cleanup(tc.revoke(t, outside))
			for _, w := range []who{nobodyWho, {neverOpened, neverOpened, nil}} {
				for _, be := range []string{"file", "gds", "bam"} {
					s, code, msg := connectAs(t, sock, w).open(be)
					if code == http.StatusForbidden {
						continue
					}
					if code != http.StatusOK {
						t.Fatalf("uid %d, %s: open: %d %s", w.uid, be, code, msg)
					}
					got, _ := s.epoch(m)
					for p, b := range got {
						if filepath.Dir(p) == "c1" && b != nil {
							t.Errorf("uid %d, %s, after %s: %s served (%d bytes), which the caller can no longer reach", w.uid, be, tc.name, p, len(b))
						}
					}
				}
			}
		})
	}
}
