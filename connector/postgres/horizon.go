package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tidemark/tidemark/connector"
)

// horizonSQL samples the server clock and the start of the oldest
// transaction still open in this database in another session. Any open
// transaction counts, not only those that already hold a transaction id:
// now() is a transaction's start time, so a transaction that has only read
// so far can still write an updated_at older than everything read since,
// and commit late. Every kind of backend counts (client sessions, and
// background workers such as pg_cron jobs or a logical replication apply
// worker firing ENABLE ALWAYS triggers), except autovacuum, which never
// writes user tables; transactions in other databases are ignored.
const horizonSQL = `SELECT clock_timestamp(), (
	SELECT min(xact_start) FROM pg_catalog.pg_stat_activity
	WHERE xact_start IS NOT NULL
	  AND backend_type NOT IN ('autovacuum worker', 'autovacuum launcher')
	  AND pid <> pg_backend_pid() AND datname = current_database())`

// Horizon reports the server's clock and the start time of the oldest
// transaction that is still running (holding a transaction id, or able to
// get one by writing), for horizon mode (docs/design.md, "The walk" and "Watermark"): W must not pass it,
// because that transaction may still commit rows whose updated_at is older
// than anything read so far. A long read-only transaction holds W back too:
// the price of never guessing which transactions will write.
//
// Privileges: pg_stat_activity shows other roles' xact_start and
// backend_xid only to superusers and members of pg_read_all_stats (or
// pg_monitor, which includes it). Without that, other roles' writers are
// invisible and the horizon silently ignores them; CheckHorizon reports it.
// Prepared (two-phase) transactions are not sessions and are not seen.
func (s *Source) Horizon(ctx context.Context) (connector.Horizon, error) {
	var now time.Time
	var oldest pgtype.Timestamptz
	if err := s.pool.QueryRow(ctx, horizonSQL).Scan(&now, &oldest); err != nil {
		return connector.Horizon{}, fmt.Errorf("sample horizon: %w", err)
	}
	h := connector.Horizon{Now: now.UTC()}
	if oldest.Valid && oldest.InfinityModifier == pgtype.Finite {
		h.OldestWriter = oldest.Time.UTC()
	}
	return h, nil
}

// CheckHorizon reports what horizon mode cannot see, one finding each:
//   - other roles' transactions, unless the role is a superuser or a member
//     of pg_read_all_stats (or pg_monitor, which includes it);
//   - sessions with track_activities off (the server default, or a
//     database or role setting), which show no xact_start at all;
//   - prepared (two-phase) transactions, which are not sessions: when
//     max_prepared_transactions is above 0 they can exist.
//
// Callers add the findings to the preflight report when horizon mode is on.
func (s *Source) CheckHorizon(ctx context.Context) ([]Finding, error) {
	var role string
	var can, trackOn bool
	var offFor []string
	var prepared int
	// pg_has_role(..., 'USAGE') follows inherited membership (pg_monitor
	// includes pg_read_all_stats) and is true for superusers.
	err := s.pool.QueryRow(ctx, `SELECT current_user::text, pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),
			(SELECT boot_val = 'on' AND reset_val = 'on' FROM pg_catalog.pg_settings WHERE name = 'track_activities')
			  AND current_setting('track_activities') = 'on',
			ARRAY(SELECT coalesce('role ' || quote_ident(r.rolname), '') || CASE WHEN r.rolname IS NOT NULL AND d.datname IS NOT NULL THEN ' in ' ELSE '' END ||
			             coalesce('database ' || quote_ident(d.datname), '')
			      FROM pg_catalog.pg_db_role_setting s
			      LEFT JOIN pg_catalog.pg_roles r ON r.oid = s.setrole
			      LEFT JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase,
			      unnest(s.setconfig) c
			      WHERE lower(c) IN ('track_activities=off', 'track_activities=false', 'track_activities=0')
			        AND (s.setdatabase = 0 OR d.datname = current_database())),
			current_setting('max_prepared_transactions')::int`).Scan(&role, &can, &trackOn, &offFor, &prepared)
	if err != nil {
		return nil, fmt.Errorf("check horizon visibility: %w", err)
	}
	var out []Finding
	if !can {
		out = append(out, Finding{Severity: Warn, Check: "horizon", Message: fmt.Sprintf(
			"role %s cannot see other roles' transactions in pg_stat_activity, so horizon mode would miss their open writes: GRANT pg_read_all_stats TO %s (or pg_monitor)",
			quote(role), quote(role))})
	} else {
		out = append(out, Finding{Severity: OK, Check: "horizon", Message: fmt.Sprintf("role %s sees every session's transactions (pg_read_all_stats)", quote(role))})
	}
	if !trackOn {
		out = append(out, Finding{Severity: Warn, Check: "horizon", Message: "track_activities is off on this server: pg_stat_activity shows no transaction start, so horizon mode cannot see open writers; turn it on (ALTER SYSTEM SET track_activities = on; SELECT pg_reload_conf())"})
	}
	if len(offFor) > 0 {
		out = append(out, Finding{Severity: Warn, Check: "horizon", Message: fmt.Sprintf(
			"track_activities is set off for %s: horizon mode cannot see their open writers; remove that setting (ALTER ROLE/DATABASE ... RESET track_activities)", strings.Join(offFor, ", "))})
	}
	if prepared > 0 {
		out = append(out, Finding{Severity: Warn, Check: "horizon", Message: fmt.Sprintf(
			"max_prepared_transactions is %d: a prepared (two-phase) transaction is not a session, so horizon mode cannot see it; if writers use PREPARE TRANSACTION, keep sync.margin above the longest time one stays prepared", prepared)})
	}
	return out, nil
}
