// SPDX-License-Identifier: Apache-2.0

// Package layers holds no code: its tests keep ARCHITECTURE.md true. The
// module's package graph is layered as its table draws it (no import runs
// from a lower layer to a higher one), every package is in the table, and
// every path, file and Go name the document writes exists where it says.
package layers
