//! How namespaces and keys become Redis keys.
//!
//! The lease key and its fence counter share one hash tag, `{ns|key}`, so both
//! live in one Redis Cluster slot and one script may touch both. `%`, `{`, `}` and
//! `|` are percent-encoded inside the tag: the tag can never end early, and the
//! encoding is injective, so two different (namespace, key) pairs never share a
//! Redis key.

pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    encode_into(&mut out, s);
    out
}

fn encode_into(out: &mut String, s: &str) {
    if !s.contains(['%', '{', '}', '|']) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '|' => out.push_str("%7C"),
            c => out.push(c),
        }
    }
}

/// The Redis names for one lease: (lease key, fence counter key). Built by
/// hand, once per operation: `format!` here was a few percent of a Redlock
/// operation's client CPU.
pub(crate) fn redis_keys(ns_encoded: &str, key: &str) -> (String, String) {
    let mut lease = String::with_capacity(ns_encoded.len() + key.len() + 16);
    lease.push('{');
    lease.push_str(ns_encoded);
    lease.push('|');
    encode_into(&mut lease, key);
    lease.push('}');
    let mut fence = String::with_capacity(lease.len() + 6);
    fence.push_str(&lease);
    lease.push_str(":lease");
    fence.push_str(":fence");
    (lease, fence)
}

/// The Redis names of a lease key's queue of waiters (same hash tag as the
/// lease).
pub(crate) fn queue_keys(lease_key: &str) -> QueueKeys {
    let tag = lease_key.strip_suffix(":lease").unwrap_or(lease_key);
    QueueKeys {
        tickets: format!("{tag}:queue"),
        deadlines: format!("{tag}:queue-deadlines"),
        counter: format!("{tag}:queue-counter"),
        marks: format!("{tag}:queue-marks"),
    }
}

/// The Redis keys of one lease key's queue of waiters (one hash tag).
pub(crate) struct QueueKeys {
    /// Sorted set of ticket members, scored by number.
    pub tickets: String,
    /// Sorted set of ticket members, scored by deadline (server ms).
    pub deadlines: String,
    /// The ticket counter.
    pub counter: String,
    /// Hash from a join's mark to its ticket member.
    pub marks: String,
}

/// A ticket's member in the queue's sorted sets: `<seq>:<mark>`, the mark in
/// 16 hex digits.
pub(crate) fn ticket_member(seq: u64, mark: u64) -> String {
    format!("{seq}:{mark:016x}")
}

/// The mark of a ticket member (`<seq>:<mark>`); zero for a malformed one.
pub(crate) fn member_mark(member: &str) -> u64 {
    member
        .split_once(':')
        .and_then(|(_, m)| u64::from_str_radix(m, 16).ok())
        .unwrap_or(0)
}

/// The release-channel message that announces a waiter leaving the queue of
/// `key`: a NUL no lease key contains, the key, and the ticket's member.
pub(crate) fn ticket_message(key: &str, member: &str) -> String {
    format!("\0q|{key}|{member}")
}

/// The tombstone that cancels one owner's acquire (same hash tag as the lease):
/// written when an acquire's outcome is unknown, so a queued acquire that runs
/// later refuses instead of leaving a lease nobody knows about.
pub(crate) fn cancel_key(lease_key: &str, owner_hex: &str) -> String {
    let tag = lease_key.strip_suffix(":lease").unwrap_or(lease_key);
    let mut key = String::with_capacity(tag.len() + 8 + owner_hex.len());
    key.push_str(tag);
    key.push_str(":cancel:");
    key.push_str(owner_hex);
    key
}

/// The SCAN pattern of every Redis key (lease, fence counter, tombstone) of
/// every namespace that starts with `prefix`. The encoded namespace ends at
/// the tag's first `|`, and encoding is per character, so a namespace starts
/// with `prefix` exactly when its encoding starts with `encode(prefix)`.
pub(crate) fn namespace_pattern(prefix: &str) -> String {
    let mut out = String::from("{");
    for c in encode(prefix).chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// The pub/sub channel on which releases in a namespace are announced; the
/// message is the released key.
pub(crate) fn release_channel(ns_encoded: &str) -> String {
    format!("lease-released|{ns_encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_cannot_end_early_and_do_not_collide() {
        let (l, f) = redis_keys(&encode("ns"), "a}b{c");
        assert_eq!(l, "{ns|a%7Db%7Bc}:lease");
        assert_eq!(f, "{ns|a%7Db%7Bc}:fence");
        // Look-alikes stay apart.
        assert_ne!(
            redis_keys(&encode("a|b"), "c"),
            redis_keys(&encode("a"), "b|c")
        );
        assert_ne!(redis_keys("ns", "%7B"), redis_keys("ns", "{"));
    }

    #[test]
    fn namespace_patterns_escape_glob_characters() {
        assert_eq!(namespace_pattern("a*b|c"), "{a\\*b%7Cc*");
        assert_eq!(namespace_pattern("[x]?\\"), "{\\[x\\]\\?\\\\*");
    }
}
