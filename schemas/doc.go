// Package schemas holds tidemark's wire formats: the JSON Schemas of the record
// value envelope, the record headers and the checkpoint, and the Go types that
// encode them. It is pure encoding: it performs no I/O.
//
// Every format carries a version. A reader refuses a version it does not know
// instead of guessing.
package schemas
