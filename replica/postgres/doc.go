// Package postgres is the PostgreSQL replica.Store: it folds a tidemark
// data topic into a table, one database transaction per batch.
//
// It owns:
//
//   - Apply: COPY the batch (last change per key) into a temporary staging
//     table of text columns, DELETE the tombstoned ids, INSERT ... ON
//     CONFLICT (id) DO UPDATE the rest with each value cast to its column's
//     type, and upsert the positions into the offsets table
//     (tidemark_replica_offsets: target_table, topic, partition,
//     next_offset, and the topic's Kafka id), all in one transaction under
//     an advisory lock. A crash anywhere leaves rows and positions
//     consistent; positions of a topic since recreated are refused.
//   - the inverse of the source's value encoding (connector/postgres
//     encode.go): base64 back to bytea, JSON arrays back to array literals,
//     embedded json/jsonb kept byte for byte, timestamps, numerics and every
//     other string as the type's text input.
//   - the target table: created from the source's column types
//     (DescribeSource) or inferred from the first batch, or checked against
//     the source with every problem named (ErrSchema).
//   - ValueError: the record id and column a value failed on, found by
//     re-checking the casts after the failed transaction rolled back.
//
// It must not: read Kafka, splice configuration into SQL (identifiers are
// quoted; type names come from the catalog or pass to_regtype first), or
// decide exit codes.
//
// Example:
//
//	tg, err := postgres.Open(ctx, postgres.Config{
//		DSN: "postgres://replica@db/shop", Table: "orders_replica", Topic: "orders",
//		Columns: cols, // postgres.DescribeSource(ctx, sourcePool, "public", "orders", nil)
//	})
//	if err != nil {
//		return err // errors.Is(err, postgres.ErrSchema): the table does not fit
//	}
//	defer tg.Close()
//	c, _ := replica.NewConsumer(replica.Config{Topic: "orders", Opts: opts}, tg)
//	_, err = c.Run(ctx, replica.Follow)
package postgres
