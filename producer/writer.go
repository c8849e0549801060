package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/failpoint"
	"github.com/tidemark/tidemark/schemas"
)

// Config configures a Writer.
type Config struct {
	// Name is the connector name: the transactional id is TransactionalID(Name).
	Name string
	// Topic is the data topic; OffsetsTopic holds the checkpoint;
	// LedgerTopic ("" = none) holds the ledger entries.
	Topic        string
	OffsetsTopic string
	LedgerTopic  string
	// TransactionTimeout is the broker-side timeout of an open transaction;
	// default 60s. It must exceed the engine's transaction duration bound.
	TransactionTimeout time.Duration
	// Compression is the codec of every produce batch; the zero value is
	// kgo.NoCompression(). kgo sends a batch uncompressed when the codec
	// would not make it smaller.
	Compression kgo.CompressionCodec
	// Linger is how long a partition's batch waits for more records before
	// it is sent; 0 (the default) sends at once. Flush, and so every
	// commit, does not wait for it.
	Linger time.Duration
	// BatchMaxBytes caps a batch of the data topic, counted before
	// compression (a larger record fails to produce). 0, or anything above
	// MaxBatchBytes, is MaxBatchBytes. The offsets and ledger topics always
	// get MaxBatchBytes: dedupe-set segments and checkpoints are sized to
	// fit it.
	BatchMaxBytes int32
	// Opts configure the connection (seed brokers, TLS, SASL, logger).
	Opts []kgo.Opt
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// TransactionalID is the transactional id of connector name.
func TransactionalID(name string) string { return "tidemark-" + name }

// MaxBatchBytes bounds every produce batch, on every topic: Kafka's
// default max.message.bytes. EnsureTopics refuses an existing offsets topic
// configured below it.
const MaxBatchBytes = 1_000_012

// MaxCheckpointBytes bounds one checkpoint record: one batch. A checkpoint
// no longer holds the dedupe set (its segments are separate records of at
// most schemas.MaxSegmentEntries entries), so in practice it is a few KiB.
const MaxCheckpointBytes = MaxBatchBytes

// Writer publishes rows and checkpoints transactionally.
type Writer struct {
	cfg Config
	cl  *kgo.Client
	hdr []byte // connector header value

	mu       sync.Mutex
	firstErr error // first failed record of the open transaction

	// Slabs the records of a transaction are carved from: a few large
	// allocations instead of several small ones per record. A slab is
	// never reused; the GC frees it once kgo is done with its records.
	recs []kgo.Record
	hdrs []kgo.RecordHeader
	tbuf []byte          // updated_at headers
	kbuf []byte          // keys
	pctx context.Context // the transaction's produce context (not cancellable)

	// Topics this session has produced to whose partitions the client is
	// not yet known to have published (see settle), and those it has;
	// dataNoted: the data topic is noted for the open transaction.
	unsettled map[string]bool
	settled   map[string]bool
	dataNoted bool
}

const slab = 1024

var _ connector.Publisher = (*Writer)(nil)

// New opens the connector's producer session and initialises it: a fresh
// InitProducerID for the transactional id, which fences any earlier session
// of this connector and makes Kafka finish (commit a prepared commit, abort
// the rest) whatever transaction that session left open. Only then may the
// checkpoint be read: every later commit comes from this session, and any
// session initialised after it fences it (docs/design.md, "One writer").
func New(ctx context.Context, cfg Config) (*Writer, error) {
	if cfg.TransactionTimeout <= 0 {
		cfg.TransactionTimeout = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &Writer{cfg: cfg, hdr: []byte(cfg.Name)}
	opts := append(append([]kgo.Opt{}, cfg.Opts...),
		kgo.TransactionalID(TransactionalID(cfg.Name)),
		kgo.TransactionTimeout(cfg.TransactionTimeout),
		// Java-compatible murmur2 of the key bytes.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// Kafka's default max.message.bytes for every topic: a dedupe-set
		// segment or a checkpoint always fits in one batch of it. The data
		// topic's batches may be capped lower (BatchMaxBytes).
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			if topic == cfg.Topic && cfg.BatchMaxBytes > 0 && cfg.BatchMaxBytes < MaxBatchBytes {
				return cfg.BatchMaxBytes
			}
			return MaxBatchBytes
		}),
		kgo.ProducerBatchCompression(cfg.Compression),
		kgo.MaxBufferedRecords(100_000),
		kgo.ProducerLinger(cfg.Linger),
	)
	if cfg.Compression == kgo.Lz4Compression() {
		opts = append(opts, kgo.WithCompressor(newLZ4Compressor()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	w.cl = cl
	if err := w.init(ctx); err != nil {
		cl.Close()
		return nil, err
	}
	return w, nil
}

// init loads the session's producer id and epoch, retrying what the broker
// reports as transient (the coordinator still finishing the previous
// session's transaction, or moving) for up to the transaction timeout plus
// 30 s.
func (w *Writer) init(ctx context.Context) error {
	id := TransactionalID(w.cfg.Name)
	deadline := time.Now().Add(w.cfg.TransactionTimeout + 30*time.Second)
	for attempt := 0; ; attempt++ {
		_, _, err := w.cl.ProducerID(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() == nil && time.Now().Before(deadline) && retryable(err) {
			t := time.NewTimer(min(100*time.Millisecond<<min(attempt, 5), 2*time.Second))
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
			continue
		}
		return fmt.Errorf("initialise transactional id %q: %w", id, classify(err))
	}
}

// Begin opens a transaction.
func (w *Writer) Begin(ctx context.Context) error {
	w.mu.Lock()
	w.firstErr = nil
	w.mu.Unlock()
	// The records belong to the transaction, not to the caller's context:
	// a shutdown must be able to finish it.
	w.pctx = context.WithoutCancel(ctx)
	w.dataNoted = false
	if err := w.cl.BeginTransaction(); err != nil {
		return classify(err)
	}
	return nil
}

func (w *Writer) promise(r *kgo.Record, err error) {
	if err == nil {
		return
	}
	w.mu.Lock()
	if w.firstErr == nil {
		w.firstErr = fmt.Errorf("produce %s key %q: %w", r.Topic, r.Key, err)
	}
	w.mu.Unlock()
}

func (w *Writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.firstErr
}

// Publish produces one row into the open transaction: key = id, value = the
// JSON value (nil = tombstone), headers operation, updated_at, connector.
func (w *Writer) Publish(ctx context.Context, r *connector.Row) error {
	if err := w.failed(); err != nil {
		return classify(err)
	}
	op := schemas.OpUpsert
	var value []byte
	if r.Deleted {
		op = schemas.OpDelete
	} else {
		value = r.Value
		if value == nil {
			value = []byte{} // never turn an upsert into a tombstone
		}
	}
	if !w.dataNoted {
		w.producedTo(w.cfg.Topic)
		w.dataNoted = true
	}
	if len(w.recs) == 0 {
		w.recs = make([]kgo.Record, slab)
		w.hdrs = make([]kgo.RecordHeader, 3*slab)
	}
	if cap(w.tbuf)-len(w.tbuf) < 32 {
		w.tbuf = make([]byte, 0, 32*slab)
	}
	if w.kbuf == nil || cap(w.kbuf)-len(w.kbuf) < len(r.ID) {
		// Never nil: the empty id is the key "", and a nil key is none.
		w.kbuf = make([]byte, 0, max(len(r.ID), 16*slab))
	}
	kstart := len(w.kbuf)
	w.kbuf = append(w.kbuf, r.ID...)
	rec := &w.recs[0]
	w.recs = w.recs[1:]
	h := w.hdrs[:3:3]
	w.hdrs = w.hdrs[3:]
	start := len(w.tbuf)
	w.tbuf = schemas.AppendTime(w.tbuf, r.UpdatedAt)
	h[0] = kgo.RecordHeader{Key: schemas.HeaderOperation, Value: opValue(op)}
	h[1] = kgo.RecordHeader{Key: schemas.HeaderUpdatedAt, Value: w.tbuf[start:len(w.tbuf):len(w.tbuf)]}
	h[2] = kgo.RecordHeader{Key: schemas.HeaderConnector, Value: w.hdr}
	*rec = kgo.Record{Topic: w.cfg.Topic, Key: w.kbuf[kstart:len(w.kbuf):len(w.kbuf)], Value: value, Headers: h}
	pctx := w.pctx
	if pctx == nil {
		pctx = context.WithoutCancel(ctx)
	}
	w.cl.Produce(pctx, rec, w.promise)
	return nil
}

var (
	upsertValue = []byte(schemas.OpUpsert)
	deleteValue = []byte(schemas.OpDelete)
)

func opValue(op string) []byte {
	if op == schemas.OpDelete {
		return deleteValue
	}
	return upsertValue
}

// Commit ends the open transaction with c: it produces the state records
// and waits for their offsets, then the checkpoint built from them and the
// ledger entry, flushes everything and commits. Any failure leaves the
// outcome to Reset: the engine never retries a commit.
func (w *Writer) Commit(ctx context.Context, c *connector.Commit) error {
	var offsets []int64
	if len(c.State) > 0 {
		w.producedTo(w.cfg.OffsetsTopic)
		offsets = make([]int64, len(c.State))
		for i, st := range c.State {
			rec := &kgo.Record{Topic: w.cfg.OffsetsTopic, Key: []byte(st.Key), Value: st.Value}
			w.cl.Produce(ctx, rec, func(r *kgo.Record, err error) {
				if err != nil {
					w.promise(r, err)
					return
				}
				offsets[i] = r.Offset // before Flush returns
			})
		}
		if err := w.flush(ctx); err != nil {
			return err
		}
	}
	if c.Checkpoint != nil {
		checkpoint, err := c.Checkpoint(offsets)
		if err != nil {
			_ = w.Abort(ctx)
			return fmt.Errorf("encode checkpoint: %w", err)
		}
		if len(checkpoint) > MaxCheckpointBytes-4096 {
			_ = w.Abort(ctx)
			return fmt.Errorf("checkpoint of %d bytes exceeds %d: %w", len(checkpoint), MaxCheckpointBytes, connector.ErrPermanent)
		}
		w.producedTo(w.cfg.OffsetsTopic)
		w.cl.Produce(ctx, &kgo.Record{Topic: w.cfg.OffsetsTopic, Key: []byte(w.cfg.Name), Value: checkpoint}, w.promise)
	}
	if c.Ledger != nil && w.cfg.LedgerTopic != "" {
		w.producedTo(w.cfg.LedgerTopic)
		w.cl.Produce(ctx, &kgo.Record{Topic: w.cfg.LedgerTopic, Key: []byte(w.cfg.Name), Value: c.Ledger}, w.promise)
	}
	if err := w.flush(ctx); err != nil {
		return err
	}
	failpoint.Hit(failpoint.DuringCommit)
	w.settle(ctx)
	if err := w.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return fmt.Errorf("end transaction (commit): %w", classify(err))
	}
	return nil
}

// flush waits for every record produced so far; on a failure it aborts.
func (w *Writer) flush(ctx context.Context) error {
	if err := w.cl.Flush(ctx); err != nil {
		_ = w.Abort(ctx)
		return fmt.Errorf("flush: %w", classify(err))
	}
	if err := w.failed(); err != nil {
		_ = w.Abort(ctx)
		return classify(err)
	}
	return nil
}

// Abort drops buffered records and aborts the open transaction.
func (w *Writer) Abort(ctx context.Context) error {
	if err := w.cl.AbortBufferedRecords(ctx); err != nil {
		return classify(err)
	}
	w.settle(ctx)
	if err := w.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return classify(err)
	}
	return nil
}

// producedTo notes that the session produces to topic.
func (w *Writer) producedTo(topic string) {
	if w.settled[topic] || w.unsettled[topic] {
		return
	}
	if w.unsettled == nil {
		w.unsettled, w.settled = map[string]bool{}, map[string]bool{}
	}
	w.unsettled[topic] = true
}

// settle waits, before a transaction ends, until the client has published
// the partitions of every topic the session produced to since the last
// settle (PartitionLeader answers for them), at most settleWait.
//
// franz-go (v1.22.3) can send a topic's first records before it publishes
// the topic's partitions: the metadata update routes the records waiting
// for the topic into the new partition buffers, where the sink may send
// them (with AddPartitionsToTxn) at once, and stores the partitions only
// after. EndTransaction resets the "added to the transaction" mark of the
// partitions it can see; a partition it cannot see yet keeps its mark, so
// the next transaction writes to it without adding it first, and the broker
// refuses that produce (INVALID_TXN_STATE; a broker without partition
// verification takes it into no transaction). The window is microseconds
// unless the metadata goroutine is descheduled in it; once the partitions
// are published the next EndTransaction sees them. docs/design.md, "One
// writer".
func (w *Writer) settle(ctx context.Context) {
	if len(w.unsettled) == 0 {
		return
	}
	deadline := time.Now().Add(settleWait)
	for topic := range w.unsettled {
		for {
			// -1 and no error, or a retriable error (the topic's load
			// failed and is retried, its records wait): the client has
			// not published the topic's partitions. A published partition
			// reports its leader, or no leader (math.MinInt32) and an
			// error. A load error that is not retried failed the records.
			if leader, _, err := w.cl.PartitionLeader(topic, 0); leader != -1 || (err != nil && !kerr.IsRetriable(err)) {
				delete(w.unsettled, topic)
				w.settled[topic] = true
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				// Ended anyway. Forget the rest: noted again when produced
				// to (a topic whose records were dropped while its load was
				// pending is not published for a long time, and nothing
				// of it is in flight).
				clear(w.unsettled)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// settleWait bounds settle: the partitions are published right after the
// records that wait for them are routed.
const settleWait = time.Second

// Recover ends whatever the session left open after a failure and makes
// its producer id usable again the way KIP-360 intends: kgo re-initialises
// with the session's current producer id and epoch (never a fresh one). The
// broker then finishes any transaction whose outcome was unknown, and a
// session that another instance has fenced is told so (ErrFenced) instead
// of fencing the newer one.
//
// The client keeps an epoch error it cannot recover from (with Kafka's
// transaction protocol version 2, an INVALID_PRODUCER_EPOCH; with version 1,
// one that the KIP-588 re-initialisation did not clear): the session is lost
// to another one, and Recover reports ErrFenced.
func (w *Writer) Recover(ctx context.Context) error {
	if err := w.cl.AbortBufferedRecords(ctx); err != nil {
		return fmt.Errorf("drop buffered records: %w", classifyRecover(err))
	}
	w.settle(ctx)
	if err := w.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		return fmt.Errorf("abort the open transaction: %w", classifyRecover(err))
	}
	if _, _, err := w.cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("re-initialise the producer session: %w", classifyRecover(err))
	}
	return nil
}

// classifyRecover is classify for what is left after a recovery. An epoch
// error, a transaction state the session cannot be in, or a producer id no
// longer mapped to the transactional id then means another session owns
// the transactional id (the embedded broker answers a fenced session's
// commit INVALID_TXN_STATE where Apache Kafka answers PRODUCER_FENCED).
// kgo keeps any other non-retriable broker answer for good, and every
// later call returns it: retrying would never end, so it stops the run.
func classifyRecover(err error) error {
	if errors.Is(err, kerr.InvalidProducerEpoch) || errors.Is(err, kerr.InvalidTxnState) || errors.Is(err, kerr.InvalidProducerIDMapping) {
		return fmt.Errorf("%w: %w", connector.ErrFenced, err)
	}
	err = classify(err)
	if errors.Is(err, connector.ErrFenced) || errors.Is(err, connector.ErrPermanent) {
		return err
	}
	if ke, ok := errors.AsType[*kerr.Error](err); ok && !ke.Retriable && ke.Code != kerr.UnknownServerError.Code {
		return fmt.Errorf("%w: the producer session cannot be recovered (the Kafka client keeps this answer for every later call); restart tidemark, which resumes from the committed checkpoint: %w", connector.ErrPermanent, err)
	}
	return err
}

// Close closes the client. An open transaction is left to the broker,
// which aborts it at its timeout or when the next session fences it.
func (w *Writer) Close() { w.cl.Close() }

// Client returns the underlying client for metadata and admin requests on
// the same connection settings. Callers must not produce with it.
func (w *Writer) Client() *kgo.Client { return w.cl }

// ErrSetting marks a setting of tidemark's that the broker refuses on every
// attempt: a configuration error (exit 2), not a transient failure.
var ErrSetting = errors.New("a setting the broker refuses")

// classify maps Kafka errors to the engine's kinds: fencing (stop, exit 4),
// permanent (stop), or transient (retry from the checkpoint).
//
// INVALID_PRODUCER_EPOCH is not fencing by itself: the broker also bumps the
// epoch when it aborts a transaction that outlived the transaction timeout.
// It is transient; the recovery that follows re-initialises with the
// session's id and epoch, and the broker answers PRODUCER_FENCED only if
// another session took over (KIP-588).
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.InvalidTransactionTimeout):
		return fmt.Errorf("the broker refuses kafka.transaction_timeout: it is above the broker's transaction.max.timeout.ms (15m by default); lower it: %w (%w): %w", ErrSetting, connector.ErrPermanent, err)
	case errors.Is(err, kerr.InvalidProducerEpoch), errors.Is(err, kerr.TransactionAbortable):
		return fmt.Errorf("the broker aborted the open transaction (it outlived kafka.transaction_timeout, or another instance took over; recovering decides which): %w", err)
	case errors.Is(err, kerr.ProducerFenced),
		errors.Is(err, kerr.TransactionalIDNotFound):
		return fmt.Errorf("%w: %w", connector.ErrFenced, err)
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed),
		errors.Is(err, kerr.TopicAuthorizationFailed),
		errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.SaslAuthenticationFailed),
		errors.Is(err, kerr.MessageTooLarge),
		errors.Is(err, kerr.RecordListTooLarge):
		return fmt.Errorf("%w: %w", connector.ErrPermanent, err)
	}
	return err
}

// retryable reports errors worth retrying for the fencing InitProducerID.
func retryable(err error) bool {
	switch {
	case errors.Is(err, kerr.ConcurrentTransactions),
		// The coordinator is still finishing the previous session's
		// transaction or loading its state.
		errors.Is(err, kerr.CoordinatorLoadInProgress),
		errors.Is(err, kerr.CoordinatorNotAvailable),
		errors.Is(err, kerr.NotCoordinator):
		return true
	}
	return kerr.IsRetriable(err)
}
