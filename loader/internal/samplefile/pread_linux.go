// SPDX-License-Identifier: Apache-2.0

package samplefile

import "golang.org/x/sys/unix"

// PreadUpTo reads up to len(b) bytes from offset off of fd into b,
// stopping early only at the end of the file, and retrying EINTR. It
// returns the bytes read; n < len(b) with a nil error means the file
// ended there (unlike io.ReadFull, that is not an error: callers compare n
// with what they expected).
func PreadUpTo(fd int, b []byte, off int64) (n int, err error) {
	for n < len(b) {
		m, err := unix.Pread(fd, b[n:], off+int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	return n, nil
}
