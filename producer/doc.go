// Package producer is the only holder of tidemark's transactional Kafka
// client. It publishes rows as records (key = id, JSON value or tombstone,
// headers), writes the checkpoint into the same transaction, and creates or
// checks the compacted topics.
//
// The transactional id is derived from the connector name, so a second
// instance of the same connector fences the first; a fenced Writer reports
// connector.ErrFenced and never writes again.
//
// Partitioning is Kafka's Java-client default: murmur2 of the key bytes, so
// every client agrees which partition holds a key.
package producer
