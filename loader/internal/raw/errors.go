// SPDX-License-Identifier: Apache-2.0

package raw

import "errors"

// ErrPastEnd is a device read that got no bytes: the device ends before
// the range (it shrank under the filesystem, or the map is wrong).
var ErrPastEnd = errors.New("device returned no data (range past the end of the device?)")
