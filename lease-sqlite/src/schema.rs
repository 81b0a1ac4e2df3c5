//! The tables of read/write leases, made with the lease table when the
//! provider first opens the file.

/// `lease_rw`: a key's writer (`w`), readers (`r`) and waiting writers
/// (`q`), each with its expiry on this boot's clock; `lease_rw_epochs`: the
/// last writer's token of each key.
pub(crate) const RW_TABLES: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS lease_rw (
        namespace  TEXT    NOT NULL,
        key        TEXT    NOT NULL,
        role       TEXT    NOT NULL,
        owner      TEXT    NOT NULL,
        token      INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        boot       TEXT    NOT NULL,
        holder     TEXT    NULL,
        PRIMARY KEY (namespace, key, role, owner)
    ) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS lease_rw_epochs (
        namespace TEXT    NOT NULL,
        key       TEXT    NOT NULL,
        epoch     INTEGER NOT NULL,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID",
];
