// SPDX-License-Identifier: Apache-2.0

package serve

import "errors"

// ErrNoToken is returned by Run for a TCP listener without a token: a TCP
// client's user cannot be known, so only a bearer token can guard it.
var ErrNoToken = errors.New("a TCP listener needs a bearer token")

// ErrConnCaps is returned by Run for connection limits that leave no
// connection to anyone but root.
var ErrConnCaps = errors.New("the connection limits leave no room for users")
