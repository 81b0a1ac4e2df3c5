//! The statements of read/write leases (C19): one row per key in
//! `<table>_rw`, holding the token counter, the last writer's token, the
//! writer, the readers and the waiting writers (JSON objects, each entry with
//! its expiry in microseconds on the database clock). Every operation is one
//! statement on that row: an upsert's ON CONFLICT sees the row's latest
//! committed version under its lock, so concurrent readers and writers of a
//! key are decided one after another.

/// The database clock in microseconds since the epoch, read once per
/// statement: every part of one decision must see the same time, or an
/// expiry falling between two readings splits it (a token kept by one SET
/// clause while another hands the key over). The statement's start is
/// never later than the lock wait it may do, so expiries it judges are
/// judged early (the safe way) and one it grants starts no earlier than
/// the client sent the request.
const NOW: &str = "(extract(epoch from statement_timestamp()) * 1000000)::bigint";

#[derive(Debug)]
pub(crate) struct RwStatements {
    pub create_table: String,
    pub read: String,
    pub write: String,
    pub extend_writer: String,
    pub extend_reader: String,
    pub release_writer: String,
    pub release_reader: String,
    /// The reader `$3` an acquire without an answer may have made, whatever
    /// its expiry; notifies `$5` on channel `$4`.
    pub release_reader_owned: String,
    /// The writer `$3` an acquire without an answer may have made, likewise.
    pub release_writer_owned: String,
    pub withdraw: String,
    pub inspect: String,
    pub purge: String,
}

impl RwStatements {
    /// The statements on `"schema"."name"`, the read/write table.
    pub(crate) fn new(schema: &str, name: &str) -> Self {
        let t = format!("\"{schema}\".\"{name}\"");
        let live_writer = format!("CASE WHEN (r.writer->>'x')::bigint > {NOW} THEN r.writer END");
        let writer_live = format!("coalesce((r.writer->>'x')::bigint > {NOW}, false)");
        let live_readers = format!(
            "coalesce((SELECT jsonb_object_agg(e.k, e.v) FROM jsonb_each(r.readers) AS e(k, v)
                        WHERE (e.v->>'x')::bigint > {NOW}), '{{}}'::jsonb)"
        );
        let readers_live = format!(
            "EXISTS (SELECT 1 FROM jsonb_each(r.readers) AS e(k, v) WHERE (e.v->>'x')::bigint > {NOW})"
        );
        let live_waiting = format!(
            "coalesce((SELECT jsonb_object_agg(e.k, e.v) FROM jsonb_each(r.waiting) AS e(k, v)
                        WHERE e.v::bigint > {NOW}), '{{}}'::jsonb)"
        );
        let waiting_live = format!(
            "EXISTS (SELECT 1 FROM jsonb_each(r.waiting) AS e(k, v) WHERE e.v::bigint > {NOW})"
        );
        let reader_free = format!("(NOT {writer_live} AND NOT {waiting_live})");
        let writer_free = format!("(NOT {writer_live} AND NOT {readers_live})");
        let key = "namespace = $1 AND key = $2";
        RwStatements {
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    namespace text   NOT NULL,
                    key       text   NOT NULL,
                    token     bigint NOT NULL,
                    epoch     bigint NOT NULL,
                    writer    jsonb  NULL,
                    readers   jsonb  NOT NULL DEFAULT '{{}}',
                    waiting   jsonb  NOT NULL DEFAULT '{{}}',
                    PRIMARY KEY (namespace, key)
                )"
            ),
            // $3 owner, $4 ttl µs, $5 holder label. Returns: taken, token,
            // the last writer's token, and the remaining µs of what refused it.
            read: format!(
                "INSERT INTO {t} AS r (namespace, key, token, epoch, writer, readers, waiting)
                 VALUES ($1, $2, 1, 0, NULL,
                         jsonb_build_object($3::text, jsonb_build_object('t', 1, 'x', {NOW} + $4::bigint, 'h', $5::text)),
                         '{{}}')
                 ON CONFLICT (namespace, key) DO UPDATE SET
                    token = CASE WHEN {reader_free} THEN r.token + 1 ELSE r.token END,
                    readers = CASE WHEN {reader_free}
                        THEN {live_readers} || jsonb_build_object($3::text,
                             jsonb_build_object('t', r.token + 1, 'x', {NOW} + $4::bigint, 'h', $5::text))
                        ELSE {live_readers} END,
                    writer = {live_writer},
                    waiting = {live_waiting}
                 RETURNING r.readers ? $3::text, (r.readers -> $3::text ->> 't')::bigint, r.epoch,
                    greatest((r.writer->>'x')::bigint,
                             (SELECT min(e.v::bigint) FROM jsonb_each(r.waiting) AS e(k, v))) - {NOW}"
            ),
            // $3 owner, $4 ttl µs, $5 holder label, $6 waiting writer's id
            // ('' for none). Returns: taken, token, remaining µs of the holders.
            write: format!(
                "INSERT INTO {t} AS r (namespace, key, token, epoch, writer, readers, waiting)
                 VALUES ($1, $2, 1, 1,
                         jsonb_build_object('o', $3::text, 't', 1, 'x', {NOW} + $4::bigint, 'h', $5::text),
                         '{{}}', '{{}}')
                 ON CONFLICT (namespace, key) DO UPDATE SET
                    token = CASE WHEN {writer_free} THEN r.token + 1 ELSE r.token END,
                    epoch = CASE WHEN {writer_free} THEN r.token + 1 ELSE r.epoch END,
                    writer = CASE WHEN {writer_free}
                        THEN jsonb_build_object('o', $3::text, 't', r.token + 1, 'x', {NOW} + $4::bigint, 'h', $5::text)
                        ELSE {live_writer} END,
                    readers = {live_readers},
                    waiting = CASE WHEN {writer_free} OR $6::text = ''
                        THEN {live_waiting} - $6::text
                        ELSE {live_waiting} || jsonb_build_object($6::text, {NOW} + $4::bigint) END
                 RETURNING coalesce(r.writer->>'o' = $3::text, false), (r.writer->>'t')::bigint,
                    greatest((r.writer->>'x')::bigint,
                             (SELECT max((e.v->>'x')::bigint) FROM jsonb_each(r.readers) AS e(k, v))) - {NOW}"
            ),
            // $3 owner, $4 token, $5 ttl µs.
            extend_writer: format!(
                "UPDATE {t} SET writer = jsonb_set(writer, '{{x}}', to_jsonb({NOW} + $5::bigint))
                  WHERE {key} AND writer->>'o' = $3 AND (writer->>'t')::bigint = $4
                    AND (writer->>'x')::bigint > {NOW}"
            ),
            extend_reader: format!(
                "UPDATE {t} SET readers = jsonb_set(readers, ARRAY[$3::text, 'x'], to_jsonb({NOW} + $5::bigint))
                  WHERE {key} AND (readers -> $3::text ->> 't')::bigint = $4
                    AND (readers -> $3::text ->> 'x')::bigint > {NOW}"
            ),
            // $3 owner, $4 token, $5 channel, $6 payload.
            release_writer: format!(
                "WITH gone AS (
                    UPDATE {t} SET writer = NULL
                     WHERE {key} AND writer->>'o' = $3 AND (writer->>'t')::bigint = $4
                       AND (writer->>'x')::bigint > {NOW}
                    RETURNING 1
                 )
                 SELECT pg_notify($5, $6) FROM gone"
            ),
            release_reader: format!(
                "WITH gone AS (
                    UPDATE {t} SET readers = readers - $3::text
                     WHERE {key} AND (readers -> $3::text ->> 't')::bigint = $4
                       AND (readers -> $3::text ->> 'x')::bigint > {NOW}
                    RETURNING 1
                 )
                 SELECT pg_notify($5, $6) FROM gone"
            ),
            release_reader_owned: format!(
                "WITH gone AS (
                    UPDATE {t} SET readers = readers - $3::text WHERE {key} AND readers ? $3::text
                    RETURNING 1
                 )
                 SELECT pg_notify($4, $5) FROM gone"
            ),
            // Not the waiting writer's record a losing attempt may have
            // renewed: the same waiter's next attempt renews it too, and
            // it ends by its expiry, as a crashed waiter's does.
            release_writer_owned: format!(
                "WITH gone AS (
                    UPDATE {t} SET writer = NULL WHERE {key} AND writer->>'o' = $3
                    RETURNING 1
                 )
                 SELECT pg_notify($4, $5) FROM gone"
            ),
            // $3 waiting writer's id, $4 channel, $5 payload.
            withdraw: format!(
                "WITH gone AS (
                    UPDATE {t} SET waiting = waiting - $3::text WHERE {key} AND waiting ? $3::text
                    RETURNING 1
                 )
                 SELECT pg_notify($4, $5) FROM gone"
            ),
            // One row per live writer ('w'), reader ('r') and waiting writer
            // ('q'), and one ('e') with the last writer's token.
            inspect: format!(
                "SELECT 'e', NULL::text, r.epoch, 0::bigint, NULL::text FROM {t} r WHERE {key}
                 UNION ALL
                 SELECT 'w', r.writer->>'o', (r.writer->>'t')::bigint, (r.writer->>'x')::bigint - {NOW},
                        r.writer->>'h'
                   FROM {t} r WHERE {key} AND (r.writer->>'x')::bigint > {NOW}
                 UNION ALL
                 SELECT 'r', e.k, (e.v->>'t')::bigint, (e.v->>'x')::bigint - {NOW}, e.v->>'h'
                   FROM {t} r, jsonb_each(r.readers) AS e(k, v)
                  WHERE {key} AND (e.v->>'x')::bigint > {NOW}
                 UNION ALL
                 SELECT 'q', e.k, 0, e.v::bigint - {NOW}, NULL
                   FROM {t} r, jsonb_each(r.waiting) AS e(k, v)
                  WHERE {key} AND e.v::bigint > {NOW}"
            ),
            purge: format!("DELETE FROM {t} WHERE left(namespace, length($1)) = $1"),
        }
    }
}
