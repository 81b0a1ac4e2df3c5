//! The statements, built once per provider from the validated table name.

use lease_api::LeaseError;

/// Checks an identifier: a letter or `_`, then letters, digits or `_`, at most
/// 63 bytes (PostgreSQL's limit). Quoted in SQL anyway; this keeps names sane.
pub(crate) fn validate_identifier(what: &str, name: &str) -> Result<(), LeaseError> {
    lease_api::backend::validate_sql_identifier(what, name, 63)
}

#[derive(Debug)]
pub(crate) struct Statements {
    /// `"schema"."table"`.
    pub table: String,
    pub create_schema: Option<String>,
    pub create_table: String,
    pub add_holder: String,
    pub has_holder: String,
    pub acquire: String,
    pub acquire_all: String,
    pub extend: String,
    pub extend_many: String,
    pub release: String,
    /// Releases the rows an acquire without an answer may have won: `$2`
    /// keys, each with the owner in `$3`; notifies each on channel `$4`.
    pub release_owned: String,
    /// Ends server session `$1` (pid) started at `$2` (microseconds since
    /// the epoch) while it is idle, runs statement `$3`, or does not say
    /// (`track_activities` off); a row while it is still there so.
    pub end_session: String,
    pub inspect: String,
    pub fence: String,
    pub purge: String,
    pub channel: String,
    /// The queue of fair waiters, beside the lease table.
    pub waiters: WaiterStatements,
    /// Read/write leases, in `<table>_rw`.
    pub rw: crate::rw_sql::RwStatements,
}

/// The statements of the fair waiters' table (`<table>_waiters`).
#[derive(Debug)]
pub(crate) struct WaiterStatements {
    pub create_table: String,
    /// Tables made before tickets had marks get the column.
    pub has_mark: String,
    pub add_mark: String,
    /// One ticket per mark: the duplicates an older version could leave
    /// go, then the unique index a join's `ON CONFLICT` relies on.
    pub dedupe_marks: String,
    pub has_mark_index: String,
    pub mark_index: String,
    pub join_unindexed: String,
    pub drop_dead_mark: String,
    pub join: String,
    pub place: String,
    pub live: String,
    pub refresh: String,
    pub leave: String,
    pub purge: String,
}

/// The name of the waiters' table of `table`: `<table>_waiters`, or for
/// long names a readable prefix and a hash, within 63 bytes.
fn waiters_name(table: &str) -> String {
    bounded_name(table, "waiters")
}

/// `<table>_<suffix>`, or for long names a readable prefix of `table` and a
/// hash of the whole, within PostgreSQL's 63 bytes.
fn bounded_name(table: &str, suffix: &str) -> String {
    let full = format!("{table}_{suffix}");
    if full.len() <= 63 {
        return full;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in full.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let keep = 63 - 18 - suffix.len();
    let mut cut = keep.min(table.len());
    while !table.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{h:016x}_{suffix}", &table[..cut])
}

impl WaiterStatements {
    fn new(schema: &str, table: &str) -> Self {
        let w = format!("\"{schema}\".\"{}\"", waiters_name(table));
        let live = "namespace = $1 AND key = $2 AND expires_at > clock_timestamp()";
        WaiterStatements {
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {w} (
                    namespace  text        NOT NULL,
                    key        text        NOT NULL,
                    seq        bigint      GENERATED ALWAYS AS IDENTITY,
                    mark       bigint      NOT NULL DEFAULT 0,
                    expires_at timestamptz NOT NULL,
                    PRIMARY KEY (namespace, key, seq)
                )"
            ),
            has_mark: format!(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = to_regclass('{}') AND attname = 'mark' AND NOT attisdropped)",
                w.replace('\'', "''")
            ),
            add_mark: format!("ALTER TABLE {w} ADD COLUMN IF NOT EXISTS mark bigint NOT NULL DEFAULT 0"),
            dedupe_marks: format!(
                "DELETE FROM {w} a USING {w} b
                  WHERE a.mark <> 0 AND a.namespace = b.namespace AND a.key = b.key
                    AND a.mark = b.mark AND a.seq > b.seq"
            ),
            has_mark_index: format!(
                "SELECT to_regclass('\"{schema}\".\"{}\"') IS NOT NULL",
                bounded_name(table, "waiters_mark").replace('\'', "''")
            ),
            mark_index: format!(
                "CREATE UNIQUE INDEX IF NOT EXISTS \"{}\" ON {w} (namespace, key, mark) WHERE mark <> 0",
                bounded_name(table, "waiters_mark")
            ),
            // A join again with a ticket's mark ($4: a retry after a lost
            // answer) renews that ticket instead of queueing behind it, even
            // while the first join is still running: the unique index makes
            // the second wait for the first and then renew its row.
            // Only a live ticket is renewed: a dead one (its waiter's join
            // lost, then the waiter cut off past the ticket's TTL) gives no
            // row, and the caller drops it (`drop_dead_mark`) and joins
            // again, at the end of the line.
            join: format!(
                "INSERT INTO {w} AS t (namespace, key, mark, expires_at)
                 VALUES ($1, $2, $4, clock_timestamp() + $3::bigint * interval '1 microsecond')
                 ON CONFLICT (namespace, key, mark) WHERE mark <> 0
                 DO UPDATE SET expires_at = EXCLUDED.expires_at
                  WHERE t.expires_at > clock_timestamp()
                 RETURNING seq"
            ),
            drop_dead_mark: format!(
                "DELETE FROM {w}
                  WHERE namespace = $1 AND key = $2 AND mark = $3 AND expires_at <= clock_timestamp()"
            ),
            // Without the unique index (a role that may not add it): a live
            // ticket of the mark is renewed, else one is added. Two joins of
            // one mark at once can then both add one.
            join_unindexed: format!(
                "WITH renewed AS (
                    UPDATE {w} SET expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond'
                     WHERE {live} AND mark = $4
                     RETURNING seq
                 ), joined AS (
                    INSERT INTO {w} (namespace, key, mark, expires_at)
                    SELECT $1, $2, $4, clock_timestamp() + $3::bigint * interval '1 microsecond'
                     WHERE NOT EXISTS (SELECT 1 FROM renewed)
                    RETURNING seq
                 )
                 SELECT seq FROM renewed UNION ALL SELECT seq FROM joined"
            ),
            // Drops the dead tickets of the key nobody else is dropping (SKIP
            // LOCKED: no waits, no deadlocks between waiters), then answers
            // whether ours ($3, marked $4) is live and which live one is just
            // ahead, with its remaining µs and its mark. The main query's
            // snapshot still has the dropped rows: every read filters on
            // expiry itself.
            place: format!(
                "WITH dead AS (
                    DELETE FROM {w} WHERE ctid IN (
                        SELECT ctid FROM {w}
                         WHERE namespace = $1 AND key = $2 AND expires_at <= clock_timestamp()
                         FOR UPDATE SKIP LOCKED)
                 )
                 SELECT EXISTS (SELECT 1 FROM {w} WHERE {live} AND seq = $3 AND mark = $4),
                        a.seq,
                        (extract(epoch from (a.expires_at - clock_timestamp())) * 1000000)::bigint,
                        a.mark
                   FROM (SELECT 1) AS one
                   LEFT JOIN LATERAL (
                        SELECT seq, mark, expires_at FROM {w} WHERE {live} AND seq < $3
                         ORDER BY seq DESC LIMIT 1) AS a ON true"
            ),
            live: format!(
                "SELECT EXISTS (SELECT 1 FROM {w} WHERE {live} AND seq = $3 AND mark = $4)"
            ),
            refresh: format!(
                "UPDATE {w} SET expires_at = clock_timestamp() + $5::bigint * interval '1 microsecond'
                  WHERE {live} AND seq = $3 AND mark = $4"
            ),
            leave: format!(
                "WITH gone AS (
                    DELETE FROM {w} WHERE namespace = $1 AND key = $2 AND seq = $3 AND mark = $4
                    RETURNING 1
                 )
                 SELECT pg_notify($5, $6) FROM gone"
            ),
            purge: format!("DELETE FROM {w} WHERE left(namespace, length($1)) = $1"),
        }
    }
}

impl Statements {
    pub(crate) fn new(schema: &str, table: &str) -> Self {
        let t = format!("\"{schema}\".\"{table}\"");
        // Remaining time in microseconds, on the database clock.
        let remaining =
            "(extract(epoch from (l.expires_at - clock_timestamp())) * 1000000)::bigint";
        Statements {
            table: t.clone(),
            create_schema: (schema != "public").then(|| format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"")),
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    namespace  text        NOT NULL,
                    key        text        NOT NULL,
                    owner      text        NULL,
                    token      bigint      NOT NULL,
                    expires_at timestamptz NULL,
                    holder     text        NULL,
                    PRIMARY KEY (namespace, key)
                )"
            ),
            // Tables made before holder labels existed.
            add_holder: format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS holder text NULL"),
            // ALTER TABLE takes an exclusive lock even when the column is there,
            // and would queue behind every open fenced transaction (and every
            // lease statement behind it): look first.
            has_holder: format!(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = to_regclass('{}') AND attname = 'holder' AND NOT attisdropped)",
                t.replace('\'', "''")
            ),
            // One statement: take the row if it is absent, released or expired
            // (bumping its token), else report the holder's remaining time.
            acquire: format!(
                "WITH won AS (
                    INSERT INTO {t} AS l (namespace, key, owner, token, expires_at, holder)
                    VALUES ($1, $2, $3, 1, clock_timestamp() + $4::bigint * interval '1 microsecond', $5)
                    ON CONFLICT (namespace, key) DO UPDATE
                       SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at,
                           holder = EXCLUDED.holder
                     WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
                    RETURNING l.token
                 )
                 SELECT true, token, 0::bigint FROM won
                 UNION ALL
                 SELECT false, l.token, {remaining} FROM {t} l
                  WHERE l.namespace = $1 AND l.key = $2 AND NOT EXISTS (SELECT 1 FROM won)"
            ),
            // A set of keys in one statement. Its existing rows are locked
            // first, in key order, skipping rows another transaction has
            // locked (an open fenced transaction, an acquire in flight): such
            // a row answers as held for a moment (20 ms), so the statement
            // never waits while holding the set's other rows. A live holder
            // in the snapshot answers as held with its remaining time. Else
            // every row is taken in key order. A row first inserted by a
            // concurrent commit after the snapshot is left alone by ON
            // CONFLICT's recheck; then fewer rows than keys were won, and the
            // division by zero aborts the statement, undoing the rest (the
            // caller runs it again on a fresh snapshot). The division is in
            // the output, evaluated per won row: in a WHERE clause that names
            // no column of the row the planner runs it once up front.
            acquire_all: format!(
                "WITH want AS (
                    SELECT w.key, w.owner FROM unnest($2::text[], $3::text[]) AS w(key, owner)
                 ),
                 present AS MATERIALIZED (
                    SELECT l.key, l.owner, l.expires_at FROM {t} l
                     WHERE l.namespace = $1 AND l.key = ANY($2::text[])
                 ),
                 locked AS MATERIALIZED (
                    SELECT l.key FROM {t} l
                     WHERE l.namespace = $1 AND l.key = ANY($2::text[])
                     ORDER BY l.key FOR UPDATE SKIP LOCKED
                 ),
                 held AS (
                    SELECT l.key, {remaining} AS remaining FROM present l
                     WHERE l.owner IS NOT NULL AND l.expires_at > clock_timestamp()
                    UNION ALL
                    SELECT l.key, 20000::bigint FROM present l
                     WHERE NOT EXISTS (SELECT 1 FROM locked k WHERE k.key = l.key)
                    ORDER BY 2 DESC, 1 LIMIT 1
                 ),
                 won AS (
                    INSERT INTO {t} AS l (namespace, key, owner, token, expires_at, holder)
                    SELECT $1, w.key, w.owner, 1, clock_timestamp() + $4::bigint * interval '1 microsecond', $5
                      FROM want w WHERE NOT EXISTS (SELECT 1 FROM held)
                     ORDER BY w.key
                    ON CONFLICT (namespace, key) DO UPDATE
                       SET owner = EXCLUDED.owner, token = l.token + 1, expires_at = EXCLUDED.expires_at,
                           holder = EXCLUDED.holder
                     WHERE l.owner IS NULL OR l.expires_at <= clock_timestamp()
                    RETURNING l.key, l.token
                 )
                 SELECT true, w.key, w.token / (CASE WHEN (SELECT count(*) FROM won) = $6 THEN 1 ELSE 0 END)
                   FROM won w
                 UNION ALL
                 SELECT false, h.key, h.remaining FROM held h"
            ),
            extend: format!(
                "UPDATE {t} SET expires_at = clock_timestamp() + $5::bigint * interval '1 microsecond'
                  WHERE namespace = $1 AND key = $2 AND owner = $3 AND token = $4
                    AND expires_at > clock_timestamp()"
            ),
            // Many leases in one statement, each row compared by owner and token.
            extend_many: format!(
                "UPDATE {t} AS l SET expires_at = clock_timestamp() + b.ttl * interval '1 microsecond'
                   FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[]) AS b(key, owner, token, ttl)
                  WHERE l.namespace = $1 AND l.key = b.key AND l.owner = b.owner AND l.token = b.token
                    AND l.expires_at > clock_timestamp()
                 RETURNING l.key, l.token"
            ),
            // Released rows keep their token, so the next acquire continues from it.
            release: format!(
                "WITH gone AS (
                    UPDATE {t} SET owner = NULL, expires_at = NULL, holder = NULL
                     WHERE namespace = $1 AND key = $2 AND owner = $3 AND token = $4
                       AND expires_at > clock_timestamp()
                    RETURNING 1
                 )
                 SELECT pg_notify($5, $6) FROM gone"
            ),
            // Whatever the expiry: a row of ours that ran out and was not
            // taken since holds nobody either way.
            release_owned: format!(
                "WITH gone AS (
                    UPDATE {t} AS l SET owner = NULL, expires_at = NULL, holder = NULL
                      FROM unnest($2::text[], $3::text[]) AS b(key, owner)
                     WHERE l.namespace = $1 AND l.key = b.key AND l.owner = b.owner
                    RETURNING l.key
                 )
                 SELECT g.key, pg_notify($4, octet_length($1) || ':' || $1 || g.key) FROM gone g"
            ),
            // `query` is cut at track_activity_query_size: a prefix of ours.
            end_session: "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                           WHERE pid = $1 AND (extract(epoch from backend_start) * 1000000)::bigint = $2
                             AND (state IN ('idle', 'disabled')
                                  OR (state = 'active' AND query <> '' AND starts_with($3, query)))"
                .to_owned(),
            inspect: format!(
                // `to_jsonb(l)->>'holder'`: NULL on a table from before holder
                // labels, which inspect reads without migrating it.
                "SELECT l.token, l.owner, {remaining}, to_jsonb(l)->>'holder' FROM {t} l
                  WHERE l.namespace = $1 AND l.key = $2 AND l.owner IS NOT NULL
                    AND l.expires_at > clock_timestamp()"
            ),
            fence: format!(
                "SELECT 1 FROM {t}
                  WHERE namespace = $1 AND key = $2 AND owner = $3 AND token = $4
                    AND expires_at > clock_timestamp()
                  FOR SHARE"
            ),
            purge: format!("DELETE FROM {t} WHERE left(namespace, length($1)) = $1"),
            channel: channel_name(schema, table),
            waiters: WaiterStatements::new(schema, table),
            rw: crate::rw_sql::RwStatements::new(schema, &bounded_name(table, "rw")),
        }
    }
}

/// The NOTIFY channel for a table: at most 63 bytes, as PostgreSQL requires.
fn channel_name(schema: &str, table: &str) -> String {
    let full = format!("lease_released.{schema}.{table}");
    if full.len() <= 63 {
        return full;
    }
    // Long names: keep a readable prefix and a hash of the whole. Two tables
    // sharing a channel would only cause spurious wake-ups.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in full.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{}.{h:016x}", &full[..46])
}

/// The NOTIFY payload naming a key: unambiguous for any namespace and key.
pub(crate) fn payload(namespace: &str, key: &str) -> String {
    format!("{}:{namespace}{key}", namespace.len())
}

/// The NOTIFY payload of a key's read/write lease: `w` first, where a plain
/// key's payload starts with a digit and a ticket's with `q`.
pub(crate) fn rw_payload(namespace: &str, key: &str) -> String {
    format!("w{}", payload(namespace, key))
}

/// The NOTIFY payload announcing that ticket `seq` of a key left its queue:
/// `q` first, where a key's payload starts with a digit.
pub(crate) fn ticket_payload(namespace: &str, key: &str, seq: u64) -> String {
    format!("q{seq}:{}", payload(namespace, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_checked() {
        for ok in ["leases", "_x", "a1_b2", &"t".repeat(63)] {
            assert!(validate_identifier("table", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "x;DROP",
            "é",
            &"t".repeat(64),
        ] {
            let err = validate_identifier("table", bad).unwrap_err().to_string();
            assert!(err.contains("invalid table"), "{err}");
        }
    }

    #[test]
    fn derived_names_fit_and_keep_their_old_form() {
        assert_eq!(waiters_name("leases"), "leases_waiters");
        let long = "t".repeat(63);
        let w = waiters_name(&long);
        assert_eq!(w.len(), 63);
        assert!(
            w.starts_with(&"t".repeat(38)) && w.ends_with("_waiters"),
            "{w}"
        );
        let i = bounded_name(&long, "waiters_mark");
        assert!(i.len() <= 63 && i.ends_with("_waiters_mark"), "{i}");
        assert_ne!(
            bounded_name(&long, "waiters_mark"),
            bounded_name(&"u".repeat(63), "waiters_mark")
        );
    }

    #[test]
    fn channels_fit_and_payloads_do_not_collide() {
        assert!(channel_name(&"s".repeat(63), &"t".repeat(63)).len() <= 63);
        assert_eq!(
            channel_name("public", "leases"),
            "lease_released.public.leases"
        );
        assert_ne!(payload("ab", "c"), payload("a", "bc"));
    }
}
