// SPDX-License-Identifier: Apache-2.0

package fresh

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nvfeed/nvfeed/bmap"
	"github.com/nvfeed/nvfeed/internal/testfs"
)

// The users and groups the trust tests use: nobody, a throwaway group
// and a group the guard is told to trust.
const (
	nobody       = 65534
	otherGroup   = 43121
	trustedGroup = 43122
)

// TestTrust: on a real ext4, the checking pass lets a raw sample be read
// raw only when no user outside the trust can change its blocks: owner,
// group and other write, ACL entries through their mask, the immutable
// attribute, and a descriptor open for writing.
func TestTrust(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	type tc struct {
		name  string
		setup func(t *testing.T, path string)
		raw   bool
	}
	chown := func(uid, gid int) func(*testing.T, string) {
		return func(t *testing.T, p string) { must(t, os.Chown(p, uid, gid)) }
	}
	chmod := func(mode os.FileMode) func(*testing.T, string) {
		return func(t *testing.T, p string) { must(t, os.Chmod(p, mode)) }
	}
	both := func(fs ...func(*testing.T, string)) func(*testing.T, string) {
		return func(t *testing.T, p string) {
			for _, f := range fs {
				f(t, p)
			}
		}
	}
	cmd := func(name string, args ...string) func(*testing.T, string) {
		return func(t *testing.T, p string) {
			if out, err := testfs.Command(name, append(args, p)...); err != nil {
				t.Fatalf("%s %v %s: %v: %s", name, args, p, err, out)
			}
		}
	}
	var heldOpen []int
	cases := []tc{
		{"root 0644", chmod(0o644), true},
		{"nobody's 0644", chown(nobody, nobody), false},
		{"root 0664, another group", both(chown(0, otherGroup), chmod(0o664)), false},
		{"root 0664, a trusted group", both(chown(0, trustedGroup), chmod(0o664)), true},
		{"root 0646 (others write)", chmod(0o646), false},
		{"ACL user:nobody:rw", cmd("setfacl", "-m", fmt.Sprintf("u:%d:rw", nobody)), false},
		{"ACL group:other:rw", cmd("setfacl", "-m", fmt.Sprintf("g:%d:rw", otherGroup)), false},
		{"ACL group:trusted:rw", cmd("setfacl", "-m", fmt.Sprintf("g:%d:rw", trustedGroup)), true},
		{"ACL user:nobody:rw masked to r", cmd("setfacl", "-m", fmt.Sprintf("u:%d:rw,m::r", nobody)), true},
		{"ACL owning group rw, mask r", both(chown(0, otherGroup), cmd("setfacl", "-m", fmt.Sprintf("g::rw,u:%d:r,m::r", nobody))), true},
		{"nobody's, immutable", both(chown(nobody, nobody), cmd("chattr", "+i")), true},
		{"nobody's 0666, immutable", both(chown(nobody, nobody), chmod(0o666), cmd("chattr", "+i")), true},
		{"root 0644, open for writing", func(t *testing.T, p string) {
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
			must(t, err)
			heldOpen = append(heldOpen, fd)
		}, false},
	}
	for i, c := range cases {
		p := fs.Path("train", "a", fmt.Sprintf("%02d.jpg", i))
		fs.WriteFile(t, "train/a/"+fmt.Sprintf("%02d.jpg", i), bytes.Repeat([]byte{byte(i)}, 12288))
		c.setup(t, p)
	}
	t.Cleanup(func() {
		for _, fd := range heldOpen {
			unix.Close(fd)
		}
		for i := range cases {
			testfs.Command("chattr", "-i", fs.Path("train", "a", fmt.Sprintf("%02d.jpg", i)))
		}
	})
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Samples) != len(cases) {
		t.Fatalf("%d samples, want %d", len(m.Samples), len(cases))
	}
	g, err := OpenWith(m, Options{Method: Watch, Trust: Trust{GIDs: []uint32{trustedGroup}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	writable := 0
	for i, c := range cases {
		if m.Samples[i].Reason != bmap.Raw {
			t.Fatalf("%s: mapped %v, want raw", c.name, m.Samples[i].Reason)
		}
		if g.ChangedAtOpen(i) {
			t.Errorf("%s: changed at open", c.name)
		}
		if got := g.RawAllowed(i); got != c.raw || g.Writable(i) == c.raw {
			t.Errorf("%s: RawAllowed %v, Writable %v; want raw %v", c.name, got, g.Writable(i), c.raw)
		}
		if !c.raw {
			writable++
		}
	}
	if got, want := g.Counts(), (Counts{Fresh: len(cases) - writable, Writable: writable}); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
}

// TestTrustChangesAreStale: every change of the immutable flag, an ACL,
// the owner or the mode moves the change time, so a sample judged
// trusted is stale after it, whatever path made it.
func TestTrustChangesAreStale(t *testing.T) {
	fs := testfs.New(t, testfs.Ext4())
	changes := []struct {
		name   string
		before []string // a command run before mapping
		change []string // the command after Open
	}{
		{"chattr +i", nil, []string{"chattr", "+i"}},
		{"chattr -i", []string{"chattr", "+i"}, []string{"chattr", "-i"}},
		{"setfacl u:nobody:rw", nil, []string{"setfacl", "-m", fmt.Sprintf("u:%d:rw", nobody)}},
		{"setfacl -b", []string{"setfacl", "-m", fmt.Sprintf("u:%d:r", nobody)}, []string{"setfacl", "-b"}},
		{"chown nobody", nil, []string{"chown", fmt.Sprint(nobody)}},
		{"chmod o+w", nil, []string{"chmod", "o+w"}},
	}
	for i, c := range changes {
		rel := fmt.Sprintf("train/a/%02d.jpg", i)
		fs.WriteFile(t, rel, bytes.Repeat([]byte{byte(i)}, 8192))
		if c.before != nil {
			if out, err := testfs.Command(c.before[0], append(c.before[1:], fs.Path(rel))...); err != nil {
				t.Fatalf("%v: %v: %s", c.before, err, out)
			}
		}
	}
	t.Cleanup(func() {
		for i := range changes {
			testfs.Command("chattr", "-i", fs.Path(fmt.Sprintf("train/a/%02d.jpg", i)))
		}
	})
	fs.Sync(t)
	m, err := bmap.Build(context.Background(), fs.Path("train"), bmap.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := Open(m, Read, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for i, c := range changes {
		if err := g.Check(i); err != nil {
			t.Fatalf("%s: stale before the change: %v", c.name, err)
		}
		// Through another hard link, outside the dataset's folders (an
		// immutable file takes no new link: through its own path). The
		// new link moves the change time: the map takes the new times.
		target := fs.Path("train", m.Samples[i].Path)
		if c.name != "chattr -i" {
			link := fs.Path(fmt.Sprintf("link%02d", i))
			must(t, os.Link(target, link))
			target = link
		}
		refreshTimes(t, m, i, fs.Path("train", m.Samples[i].Path))
		if err := g.Check(i); err != nil {
			t.Fatalf("%s: stale after refreshing the map's times: %v", c.name, err)
		}
		if out, err := testfs.Command(c.change[0], append(c.change[1:], target)...); err != nil {
			t.Fatalf("%v: %v: %s", c.change, err, out)
		}
		if err := g.Check(i); !errors.Is(err, bmap.ErrStale) {
			t.Errorf("%s through a hard link: Check = %v, want ErrStale", c.name, err)
		}
	}
}

// refreshTimes sets sample i's mapped times to the file's now.
func refreshTimes(t *testing.T, m *bmap.Map, i int, path string) {
	var st unix.Stat_t
	must(t, unix.Stat(path, &st))
	m.Samples[i].MtimeNs, m.Samples[i].CtimeNs = st.Mtim.Nano(), st.Ctim.Nano()
}

// TestParseACL: the kernel's ACL xattr format, and what it refuses.
func TestParseACL(t *testing.T) {
	acl := func(entries ...ACLEntry) []byte {
		b := binary.LittleEndian.AppendUint32(nil, aclVersion)
		for _, e := range entries {
			b = binary.LittleEndian.AppendUint16(b, e.Tag)
			b = binary.LittleEndian.AppendUint16(b, e.Perm)
			b = binary.LittleEndian.AppendUint32(b, e.ID)
		}
		return b
	}
	minimal := []ACLEntry{{ACLUserObj, 6, 0}, {ACLGroupObj, 4, 0}, {ACLOther, 4, 0}}
	named := append(append([]ACLEntry{}, minimal...), ACLEntry{ACLUser, 6, nobody}, ACLEntry{ACLMask, 4, 0})
	for _, c := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"minimal", acl(minimal...), true},
		{"named with mask", acl(named...), true},
		{"empty", nil, false},
		{"ragged", acl(minimal...)[:15], false},
		{"version 1", append([]byte{1, 0, 0, 0}, acl(minimal...)[4:]...), false},
		{"unknown tag", acl(append(minimal, ACLEntry{0x40, 4, 0})...), false},
		{"permission bits", acl(ACLEntry{ACLUserObj, 8, 0}, minimal[1], minimal[2]), false},
		{"two owners", acl(append(minimal, minimal[0])...), false},
		{"no other", acl(minimal[:2]...), false},
		{"named without mask", acl(append(minimal, ACLEntry{ACLUser, 6, nobody})...), false},
	} {
		_, err := ParseACL(c.b)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrACL)) {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
}

// FuzzParseACL: no input panics; what parses judges without error and
// re-encodes to the same bytes.
func FuzzParseACL(f *testing.F) {
	f.Add([]byte{2, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 4, 0, 4, 0, 0, 0, 0, 0, 32, 0, 4, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 2, 0, 6, 0, 254, 255, 0, 0, 4, 0, 4, 0, 0, 0, 0, 0, 16, 0, 4, 0, 0, 0, 0, 0, 32, 0, 4, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := ParseACL(b)
		if err != nil {
			if !errors.Is(err, ErrACL) {
				t.Fatalf("error %v does not wrap ErrACL", err)
			}
			return
		}
		out := binary.LittleEndian.AppendUint32(nil, aclVersion)
		for _, e := range entries {
			out = binary.LittleEndian.AppendUint16(out, e.Tag)
			out = binary.LittleEndian.AppendUint16(out, e.Perm)
			out = binary.LittleEndian.AppendUint32(out, e.ID)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoded %x, parsed from %x", out, b)
		}
		if err := (Trust{}).judge(0, 0, 0o644, b); err != nil && !errors.Is(err, ErrUntrusted) {
			t.Fatalf("judge of a parsed ACL: %v", err)
		}
	})
}
