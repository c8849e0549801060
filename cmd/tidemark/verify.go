package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/verify"
)

// errMismatch is returned by verify when the target differs (exit 5).
var errMismatch = errors.New("verify found differences")

// replicaOfOneTask refuses verify --replica-table for every task of a
// configuration with tables: the flag names one replica table, the copy of
// one task, and each other task's source would be compared with it.
func replicaOfOneTask(run func(context.Context, *cli) error) func(context.Context, *cli) error {
	return func(ctx context.Context, a *cli) error {
		if a.replicaTable != "" && len(a.cfg.Tasks) > 0 && a.taskFlag == "" {
			return usageErrorf("--replica-table names the replica of one table: this configuration has tables:, so name the task it copies with --task (one of %s)", a.cfg.taskNames())
		}
		return run(ctx, a)
	}
}

// cmdVerify compares the source, under one snapshot, with the data topic
// (or with a replica table) by key set and content digest.
func cmdVerify(ctx context.Context, a *cli) error {
	defer a.closeAll()
	if a.replicaTable == "" {
		// The other --replica-* flags describe the replica table: without
		// it, verify would compare the topic and ignore them.
		for _, f := range []struct{ name, value string }{{"--replica-dsn", a.replicaDSN}, {"--replica-schema", a.replicaSchema},
			{"--replica-password-env", a.replicaPasswordEnv}, {"--replica-password-file", a.replicaPasswordFile}} {
			if f.value != "" {
				return usageErrorf("%s needs --replica-table: name the replica table to compare (tidemark verify --config FILE --replica-table orders_replica %s ...), or drop %s to verify the topic", f.name, f.name, f.name)
			}
		}
	}
	if err := a.needsLiveRows("verify"); err != nil {
		return err
	}
	if a.replicaDSN != "" {
		if err := a.checkDSN("--replica-dsn", a.replicaDSN); err != nil { // before anything connects
			return err
		}
	}
	// Like `run --once`, verify waits at start-up for a server that does
	// not answer yet, up to sync.once_retry_timeout (startup.go).
	var src connector.Source
	if err := a.startup(ctx, "the source", "source", func() (err error) {
		src, err = a.source(ctx)
		return err
	}); err != nil {
		return err
	}
	scanner, ok := src.(connector.LiveScanner)
	if !ok {
		return &ConfigError{Key: "source.kind", Msg: "verify needs a source that can list its live rows (postgres)"}
	}
	var target connector.TopicView
	name := "topic " + a.cfg.Kafka.Topic
	if a.replicaTable != "" {
		pc, err := a.pgConfig()
		if err != nil {
			return err
		}
		dsnKey := "source.dsn"
		if a.replicaDSN != "" {
			pc.DSN, dsnKey = a.replicaDSN, "--replica-dsn"
		}
		if pc.Password, pc.PasswordFile, err = a.otherPassword("--replica-password", a.replicaPasswordEnv, a.replicaPasswordFile, dsnKey, pc.DSN); err != nil {
			return err
		}
		pc.Table, pc.Filter, pc.DeletedAtColumn = a.replicaTable, "", ""
		if a.replicaSchema != "" {
			pc.Schema = a.replicaSchema
		}
		var rs *postgres.Source
		if err := a.startup(ctx, "the replica database", "source", func() (err error) {
			if rs, err = postgres.New(ctx, pc); err != nil {
				return openError(dsnKey, pc.DSN, fmt.Sprintf("open the replica table %s.%s (--replica-schema, default source.schema, and --replica-table name it) at", pc.Schema, pc.Table), err)
			}
			return nil
		}); err != nil {
			return err
		}
		a.closers = append(a.closers, rs.Close)
		target = verify.Scanned{LiveScanner: rs}
		name = "table " + pc.Schema + "." + pc.Table
	} else {
		opts, err := a.kafkaOpts()
		if err != nil {
			return err
		}
		if err := a.waitForKafka(ctx, opts); err != nil {
			return err
		}
		target = fold.Topic{Opts: opts, Topic: a.cfg.Kafka.Topic, SameRecords: true}
	}
	a.log.Info("verify: reading the target, then the source under one snapshot", "target", name)
	rep, err := verify.Options{MaxKeysInMemory: a.sweepMaxKeys()}.Compare(ctx, scanner, target, name)
	if err != nil {
		return err
	}
	a.log.Info("verify finished", "ok", rep.OK(), "missing", rep.Missing, "extra", rep.Extra, "mismatched", rep.Mismatched,
		"duplicate_publications", rep.Duplicates, "records_back_in_time", rep.Backwards, "back_in_time_unchecked", rep.Unchecked,
		"records_without_updated_at", rep.Undated, "misplaced_records", rep.Misplaced, "partitions_cut_short", rep.CutShort,
		"source_rows", rep.SourceRows, "live_keys", rep.LiveKeys)
	if a.jsonOut {
		b, _ := json.MarshalIndent(struct {
			*verify.Report
			OK bool `json:"ok"`
		}{rep, rep.OK()}, "", "  ")
		fmt.Fprintln(a.stdout, string(b))
	} else {
		fmt.Fprint(a.stdout, rep.Text())
	}
	if !rep.OK() {
		return fmt.Errorf("%w: %d missing, %d extra, %d mismatched, %d duplicate publications, %d records back in time not checked for repeats, %d records outside their key's partition, %d partitions whose view was cut short by an open transaction",
			errMismatch, rep.Missing, rep.Extra, rep.Mismatched, rep.Duplicates, rep.Unchecked, rep.Misplaced, rep.CutShort)
	}
	return nil
}

// cmdSweep runs one reconciliation sweep now. It takes over the connector's
// transactional id, so a running `tidemark run` of the same connector is
// fenced (exit 4): prefer sweep.interval for a connector that runs
// continuously.
func cmdSweep(ctx context.Context, a *cli) error {
	defer a.closeAll()
	if err := a.needsLiveRows("sweep"); err != nil {
		return err
	}
	e, opts, err := a.engine(ctx)
	if err != nil {
		return err
	}
	res, err := e.SweepOnce(ctx, fold.Topic{Opts: opts, Topic: a.cfg.Kafka.Topic})
	if err != nil {
		return err
	}
	if a.jsonOut {
		b, _ := json.MarshalIndent(res, "", "  ")
		fmt.Fprintln(a.stdout, string(b))
	} else {
		fmt.Fprintln(a.stdout, res.String())
	}
	return nil
}

// needsLiveRows refuses, before anything connects, a command that reads
// every live row of the source (verify, sweep) when the source is an HTTP
// changes API, which cannot list them.
func (a *cli) needsLiveRows(cmd string) error {
	if a.isPostgres() {
		return nil
	}
	return &ConfigError{Key: "source.kind", Origin: a.cfg.origin["source.kind"], Msg: fmt.Sprintf(
		"tidemark %s compares every live row of the source, and source.kind %s (a changes API) cannot list them; "+
			"run it with a configuration of the PostgreSQL table behind the API (source.kind postgres), and let the API report deletes as deleted items", cmd, a.cfg.Source.Kind)}
}
