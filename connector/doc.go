// Package connector is tidemark's walk engine: passes and pages over an
// upstream delta feed (a Source), boundary-set dedupe by content digest, and
// the batching of pages into Kafka transactions that also carry the
// checkpoint.
//
// The engine owns the interfaces it consumes: Source (implemented by
// connector/postgres and the HTTP source), and Publisher and CheckpointStore
// (implemented by producer and offsets). It never talks to Kafka or a
// database itself, and it never parses a source's cursor.
//
// The guarantees it keeps (docs/design.md, "The walk" and "Watermark", "Records"):
//
//   - a pass starts at updated_at >= W - margin and walks to the current end;
//     it ends only when the source says so (an empty page after the cursor);
//   - the in-memory position advances only after the transaction that holds
//     the records and the checkpoint has committed; any failure discards the
//     uncommitted state and resumes from the last committed checkpoint;
//   - a re-read row whose value digest equals the one in the boundary set is
//     skipped; any content change is published.
package connector
