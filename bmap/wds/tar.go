// SPDX-License-Identifier: Apache-2.0

package wds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// BlockSize is the tar block size: headers and member data start on it.
const BlockSize = 512

// Sentinels of ReadTar's errors (wrapped, with the shard and member).
var (
	// ErrCorruptTar: a header's checksum or a field is wrong, or a header
	// is cut short (DALI: "Corrupted tar file").
	ErrCorruptTar = errors.New("corrupt tar")
	// ErrCompressed: the shard is gzip, bzip2, xz, zstd or lz4
	// compressed; fn.readers.webdataset reads plain tars only.
	ErrCompressed = errors.New("compressed tar (fn.readers.webdataset reads uncompressed tars only)")
	// ErrSparse: a GNU sparse member, whose stored bytes are not the
	// file's.
	ErrSparse = errors.New("sparse member")
	// ErrMemberType: a member that is neither a regular file nor a
	// directory (a link, device, fifo, or an unknown type), which DALI
	// skips silently.
	ErrMemberType = errors.New("member is not a regular file")
	// ErrTruncated: a member's data runs past the end of the shard.
	ErrTruncated = errors.New("member data past the end of the tar")
	// ErrPAXSize: a PAX header overrides a member's size, which DALI
	// ignores (it would read the wrong bytes).
	ErrPAXSize = errors.New("PAX size override (DALI reads the ustar size field only)")
)

// Member is one regular file in a tar, as DALI's TarArchive (libtar)
// reads it.
type Member struct {
	Name   string // libtar's th_get_pathname: a GNU long name, else prefix/name or name
	Header int64  // offset of the member's first header block (a GNU long name's, or a skipped empty block's)
	Offset int64  // offset of the member's data: a multiple of BlockSize
	Size   int64  // the data's size in bytes
}

// compressed magics, by name.
var compressed = []struct {
	name  string
	magic []byte
}{
	{"gzip", []byte{0x1f, 0x8b}},
	{"bzip2", []byte("BZh")},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},
	{"lz4", []byte{0x04, 0x22, 0x4d, 0x18}},
}

// ReadTar lists the regular members of tar r as DALI's TarArchive over libtar reads them.
//
//   - Headers are read one block at a time; two NUL-named blocks or the file's end end it.
//   - A header's checksum, unsigned or signed, must match.
//   - A GNU long name or long link names the next header.
//   - PAX headers are skipped, as DALI reads the ustar name; a size override is ErrPAXSize.
//   - Directories are skipped.
//
// Where DALI skips or misreads silently, ReadTar fails naming shard and member.
// That is ErrMemberType, ErrSparse, ErrTruncated, and ErrCompressed before any header.
func ReadTar(r io.ReaderAt, size int64, shard string) ([]Member, error) {
	var head [6]byte
	if n, _ := r.ReadAt(head[:], 0); n > 0 {
		for _, c := range compressed {
			if n >= len(c.magic) && bytes.Equal(head[:len(c.magic)], c.magic) {
				return nil, fmt.Errorf("%s: %w: %s", shard, ErrCompressed, c.name)
			}
		}
	}
	t := tarReader{r: r, size: size, shard: shard}
	var out []Member
	for t.pos < size {
		m, ok, err := t.next()
		if err != nil || !ok {
			return out, err
		}
		if m.Offset+m.Size > size || m.Offset+m.Size < m.Offset {
			return nil, fmt.Errorf("%s: member %q at %d: %w: %d bytes from %d, the tar is %d", shard, m.Name, m.Header, ErrTruncated, m.Size, m.Offset, size)
		}
		out = append(out, m)
	}
	return out, nil
}

// tarReader walks a tar's headers.
type tarReader struct {
	r     io.ReaderAt
	size  int64
	shard string
	pos   int64
	blk   [BlockSize]byte
}

// errEnd ends the archive where libtar's th_read returns 1.
var errEnd = errors.New("end of archive")

// next returns the next regular member (ok), or ok false at the end of
// the archive; it skips what DALI skips and fails where DALI would fail
// or misread.
func (t *tarReader) next() (m Member, ok bool, err error) {
	for t.pos < t.size {
		start := t.pos
		typ, name, size, err := t.header()
		if errors.Is(err, errEnd) {
			return Member{}, false, nil
		}
		if err != nil {
			return Member{}, false, err
		}
		data := t.pos
		// NextFile: past the data, rounded up to a block.
		t.pos = data + roundUp(size)
		m := Member{Name: name, Header: start, Offset: data, Size: size}
		switch {
		case typ == 'S':
			return Member{}, false, t.errf(m, ErrSparse, "GNU sparse file")
		case typ == '0' || typ == 0 || typ == '7':
			return m, true, nil
		case typ == '5':
			continue
		case typ == 'x' || typ == 'g':
			if err := t.checkPAX(m); err != nil {
				return Member{}, false, err
			}
			continue
		default:
			return Member{}, false, t.errf(m, ErrMemberType, "type %q", string(rune(typ)))
		}
	}
	return Member{}, false, nil
}

func (t *tarReader) errf(m Member, sentinel error, format string, a ...any) error {
	return fmt.Errorf("%s: member %q at %d: %w: %s", t.shard, m.Name, m.Header, sentinel, fmt.Sprintf(format, a...))
}

// header reads one entry's headers as libtar's th_read does: end blocks,
// then a header, with its GNU long link and long name blocks. It returns
// the entry's type, name and size, t.pos at its data.
func (t *tarReader) header() (typ byte, name string, size int64, err error) {
	if err := t.block(false); err != nil {
		return 0, "", 0, err
	}
	if t.blk[156] == 'K' {
		if _, err := t.longName(); err != nil {
			return 0, "", 0, err
		}
		if err := t.block(true); err != nil {
			return 0, "", 0, err
		}
	}
	var long string
	hasLong := false
	if t.blk[156] == 'L' {
		if long, err = t.longName(); err != nil {
			return 0, "", 0, err
		}
		hasLong = true
		if err := t.block(true); err != nil {
			return 0, "", 0, err
		}
	}
	typ = t.blk[156]
	if size, err = t.fieldSize(); err != nil {
		return 0, "", 0, err
	}
	if hasLong {
		name = long
	} else if t.blk[345] != 0 {
		name = cstr(t.blk[345:500]) + "/" + cstr(t.blk[0:100])
	} else {
		name = cstr(t.blk[0:100])
	}
	// libtar's TH_ISREG also takes a regular mode with any type but a
	// hard link's: the types DALI reads as regular files then.
	if mode, ok := octal(t.blk[100:108]); ok && mode&0o170000 == 0o100000 && typ != '1' && typ != 'S' {
		typ = '0'
	}
	return typ, name, size, nil
}

// block reads the next header block at t.pos, checked; two end blocks in a row end the archive.
// inner: a header after a long name, where the end of the file is corruption.
func (t *tarReader) block(inner bool) error {
	zeros := 0
	for {
		if t.pos >= t.size && !inner && zeros == 0 {
			return errEnd
		}
		n, err := t.r.ReadAt(t.blk[:], t.pos)
		if n == 0 && (err == io.EOF || err == nil) && !inner {
			return errEnd
		}
		if n < BlockSize {
			if err == nil || err == io.EOF {
				return fmt.Errorf("%s: header at %d: %w: %d of %d bytes before the end of the file", t.shard, t.pos, ErrCorruptTar, n, BlockSize)
			}
			return fmt.Errorf("%s: header at %d: %w", t.shard, t.pos, err)
		}
		t.pos += BlockSize
		if t.blk[0] == 0 {
			if zeros++; zeros >= 2 {
				return errEnd
			}
			continue
		}
		return t.checksum(t.pos - BlockSize)
	}
}

// checksum checks the header in t.blk (at off) as libtar's th_crc_ok.
func (t *tarReader) checksum(off int64) error {
	want, ok := octal(t.blk[148:156])
	var u, s int64
	for i, b := range t.blk {
		if i >= 148 && i < 156 {
			b = ' '
		}
		u += int64(b)
		s += int64(int8(b))
	}
	if !ok || (want != u && want != s) {
		return fmt.Errorf("%s: header at %d (%q): %w: checksum %q, sum %d", t.shard, off, cstr(t.blk[:100]), ErrCorruptTar, cstr(t.blk[148:156]), u)
	}
	return nil
}

// fieldSize parses the size field of the header in t.blk.
func (t *tarReader) fieldSize() (int64, error) {
	f := t.blk[124:136]
	if f[0]&0x80 != 0 {
		return 0, fmt.Errorf("%s: header at %d (%q): %w: base-256 size, which DALI (libtar) does not read", t.shard, t.pos-BlockSize, cstr(t.blk[:100]), ErrCorruptTar)
	}
	n, ok := octal(f)
	if !ok {
		return 0, fmt.Errorf("%s: header at %d (%q): %w: size field %q", t.shard, t.pos-BlockSize, cstr(t.blk[:100]), ErrCorruptTar, f)
	}
	return n, nil
}

// longName reads a GNU long name's (or link's) data blocks after its
// header in t.blk, returning the C string they hold.
func (t *tarReader) longName() (string, error) {
	size, err := t.fieldSize()
	if err != nil {
		return "", err
	}
	if size > 1<<20 {
		return "", fmt.Errorf("%s: header at %d: %w: a long name of %d bytes", t.shard, t.pos-BlockSize, ErrCorruptTar, size)
	}
	n := roundUp(size)
	if t.pos+n > t.size {
		return "", fmt.Errorf("%s: header at %d: %w: long name past the end of the file", t.shard, t.pos-BlockSize, ErrCorruptTar)
	}
	b := make([]byte, n)
	if _, err := t.r.ReadAt(b, t.pos); err != nil && !(err == io.EOF && int64(len(b)) == n) {
		return "", fmt.Errorf("%s: long name at %d: %w", t.shard, t.pos, err)
	}
	t.pos += n
	return cstr(b), nil
}

// checkPAX refuses a PAX header whose records override the size.
func (t *tarReader) checkPAX(m Member) error {
	if m.Size > 1<<20 || m.Offset+m.Size > t.size {
		return t.errf(m, ErrCorruptTar, "PAX header of %d bytes", m.Size)
	}
	b := make([]byte, m.Size)
	if _, err := t.r.ReadAt(b, m.Offset); err != nil && err != io.EOF {
		return fmt.Errorf("%s: PAX header at %d: %w", t.shard, m.Header, err)
	}
	for len(b) > 0 {
		sp := bytes.IndexByte(b, ' ')
		if sp < 0 {
			break
		}
		n, ok := decimal(b[:sp])
		if !ok || n <= int64(sp) || n > int64(len(b)) {
			break // DALI does not read the records: nor do we, past a bad one
		}
		rec := string(b[sp+1 : n])
		if k, _, _ := strings.Cut(rec, "="); k == "size" {
			return t.errf(m, ErrPAXSize, "record %q", strings.TrimRight(rec, "\n"))
		}
		b = b[n:]
	}
	return nil
}

// octal parses a numeric header field as libtar's sscanf("%o"): leading
// spaces, then octal digits up to a NUL, space or the field's end (all
// digits: refused, since sscanf would read on into the next field).
func octal(f []byte) (int64, bool) {
	i := 0
	for i < len(f) && f[i] == ' ' {
		i++
	}
	var n int64
	digits := 0
	for ; i < len(f) && f[i] >= '0' && f[i] <= '7'; i++ {
		n = n<<3 | int64(f[i]-'0')
		digits++
	}
	if digits == 0 || i == len(f) && digits == len(f) {
		return 0, false
	}
	return n, true
}

func decimal(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// cstr returns b up to its first NUL.
func cstr(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func roundUp(n int64) int64 { return (n + BlockSize - 1) &^ (BlockSize - 1) }
