// Package replica folds a tidemark data topic into a store, exactly once:
// it reads the topic read_committed from the positions the store itself
// holds, and applies each batch of records together with the positions it
// reaches, atomically. A crash anywhere resumes exactly where the applied
// state is; no consumer-group commit is trusted.
//
// It owns:
//
//   - Store, the small interface a fold target implements (Apply a batch
//     with its positions, report the positions), with Resetter as an
//     optional capability for rebuilding from the beginning;
//   - Memory, an in-memory Store (tests and `tidemark verify` use it);
//   - Consumer, the loop: read from the stored positions, batch, Apply,
//     log progress and lag, stop when caught up (Once) or run until the
//     context ends (Follow).
//
// The PostgreSQL Store lives in replica/postgres.
//
// It must not: commit consumer-group offsets, decide exit codes, or know
// how a store represents rows. A record with a null value is a tombstone;
// within a batch the last record per key wins.
//
// Example:
//
//	mem := replica.NewMemory()
//	c, err := replica.NewConsumer(replica.Config{Topic: "orders", Opts: opts}, mem)
//	if err != nil {
//		return err
//	}
//	stats, err := c.Run(ctx, replica.Once) // caught up with the end observed at start
//	rows := mem.Rows()                    // key -> JSON value
package replica
