// SPDX-License-Identifier: Apache-2.0

// Package layers holds no code. Its tests keep the module layered and the
// documents true. layers() in its test gives each package its layer, and no
// import may run from a lower layer to a higher one. Every path and Go name
// the documents write must exist. ARCHITECTURE.md must stay a short map.
package layers
