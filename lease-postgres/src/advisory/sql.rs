//! The statements of the advisory-lock mode: lock and token row in one
//! statement, renewal and release on the holder's session, inspect by `pg_locks`.

pub(super) struct AdvisorySql {
    pub(super) acquire: String,
    pub(super) extend: String,
    pub(super) release: String,
    pub(super) release_elsewhere: String,
    pub(super) inspect: String,
}

impl AdvisorySql {
    pub(super) fn new(t: &str) -> Self {
        let remaining = "greatest((extract(epoch from (r.expires_at - clock_timestamp())) * 1000000)::bigint, 0)";
        // What a refused acquirer is told: the holder's remaining TTL, at
        // least 50 ms (a lease past its TTL whose session the server is
        // ending), or nothing when no row explains the lock.
        let held_for =
            format!("CASE WHEN r.owner IS NULL THEN NULL ELSE greatest({remaining}, 50000) END");
        // Only the lock's holder gets past `l.got`, so the upsert is
        // unconditional: a new token for every acquisition. The server's idle
        // timer becomes the lease's TTL.
        let acquire = format!(
            "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock($3) AS got),
             s AS MATERIALIZED (
                SELECT set_config('idle_session_timeout', CASE WHEN l.got THEN $7 ELSE '0' END, false)
                       || set_config('application_name', CASE WHEN l.got THEN 'lease-advisory ' || $4 ELSE 'lease-advisory' END, false)
                       AS v FROM l
             ),
             won AS (
                INSERT INTO {t} AS r (namespace, key, owner, token, expires_at, holder)
                SELECT $1, $2, $4, 1, clock_timestamp() + $5::bigint * interval '1 microsecond', $6
                  FROM l, s WHERE l.got AND s.v IS NOT NULL
                ON CONFLICT (namespace, key) DO UPDATE
                   SET owner = EXCLUDED.owner, token = r.token + 1, expires_at = EXCLUDED.expires_at,
                       holder = EXCLUDED.holder
                RETURNING r.token
             )
             SELECT true, token, 0::bigint, pg_backend_pid() FROM won
             UNION ALL
             SELECT false, r.token, {held_for}, 0
               FROM l LEFT JOIN {t} r ON r.namespace = $1 AND r.key = $2 AND r.owner IS NOT NULL
              WHERE NOT l.got"
        );
        // Only on the session that took the lock ($7: a pooler in
        // transaction mode would run this on another). The row is read, not
        // locked, to decide: a fenced transaction of the holder holds it FOR
        // SHARE, and the renewal must not wait for it; its expires_at (what
        // inspect and begin_fenced read) moves when the row is free.
        let extend = format!(
            "WITH s AS MATERIALIZED (
                SELECT set_config('idle_session_timeout', $6, false) AS v WHERE pg_backend_pid() = $7
             ),
             mine AS MATERIALIZED (
                SELECT 1 FROM {t} r, s
                 WHERE r.namespace = $1 AND r.key = $2 AND r.owner = $3 AND r.token = $4 AND s.v IS NOT NULL
             ),
             moved AS (
                UPDATE {t} SET expires_at = clock_timestamp() + $5::bigint * interval '1 microsecond'
                 WHERE ctid IN (
                    SELECT r.ctid FROM {t} r
                     WHERE r.namespace = $1 AND r.key = $2 AND r.owner = $3 AND r.token = $4
                       AND EXISTS (SELECT 1 FROM mine)
                       FOR UPDATE SKIP LOCKED
                 )
                RETURNING 1
             )
             SELECT (SELECT count(*) FROM mine), (SELECT count(*) FROM moved)"
        );
        // The row first, then the lock: an acquirer that gets the lock in
        // between waits for this row until the statement commits.
        let release = format!(
            "WITH gone AS (
                UPDATE {t} SET owner = NULL, expires_at = NULL, holder = NULL
                 WHERE namespace = $1 AND key = $2 AND owner = $3 AND token = $4 AND pg_backend_pid() = $8
                RETURNING 1
             )
             SELECT pg_advisory_unlock($5), pg_notify($6, $7), set_config('idle_session_timeout', '0', false),
                    set_config('application_name', 'lease-advisory', false)
               FROM gone"
        );
        // A lease this provider does not hold (`lease release` in another
        // process, a restarted service): its session is found by the owner
        // in its application name and ended, which frees the lock. Waits up
        // to a second for the session to exit, so the NOTIFY at commit finds
        // the key free.
        let release_elsewhere = format!(
            "WITH target AS MATERIALIZED (
                SELECT 1 FROM {t}
                 WHERE namespace = $1 AND key = $2 AND owner = $3 AND token = $4
                   AND expires_at > clock_timestamp()
             ),
             ended AS MATERIALIZED (
                SELECT pg_terminate_backend(a.pid, 1000) AS done
                  FROM pg_stat_activity a
                 WHERE a.application_name = 'lease-advisory ' || $3 AND EXISTS (SELECT 1 FROM target)
             ),
             gone AS (
                UPDATE {t} SET owner = NULL, expires_at = NULL, holder = NULL
                 WHERE namespace = $1 AND key = $2 AND owner = $3 AND token = $4
                   AND EXISTS (SELECT 1 FROM ended WHERE ended.done)
                RETURNING 1
             )
             SELECT pg_notify($5, $6) FROM gone"
        );
        // A row says who took the lock last; pg_locks says whether that
        // holder's own session (named by its owner in its application name)
        // still holds it. Any session would not do: a release unlocks before
        // its row change commits, and a session that takes the lock in
        // between (a waiter's watch, the next acquirer) would make the old
        // row look held again.
        let inspect = format!(
            "SELECT r.token, r.owner, {remaining}, r.holder FROM {t} r
              WHERE r.namespace = $1 AND r.key = $2 AND r.owner IS NOT NULL
                AND EXISTS (
                    SELECT 1 FROM pg_locks k JOIN pg_stat_activity a ON a.pid = k.pid
                     WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
                       AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                       AND k.classid = (($3::bigint >> 32) & 4294967295)::oid
                       AND k.objid = ($3::bigint & 4294967295)::oid
                       AND a.application_name = 'lease-advisory ' || r.owner
                )"
        );
        AdvisorySql {
            acquire,
            extend,
            release,
            release_elsewhere,
            inspect,
        }
    }
}
