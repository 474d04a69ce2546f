// SPDX-License-Identifier: Apache-2.0

// Package layers holds no code: its test keeps the module's package graph
// layered as ARCHITECTURE.md draws it, so that no import runs from a
// lower layer to a higher one.
package layers
