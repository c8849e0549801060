// Package offsets owns where tidemark's position lives in Kafka: the
// checkpoint record (key = connector name) on the compacted offsets topic.
// The producer writes it inside the data transaction; Store reads the latest
// committed one back read_committed.
package offsets
