//! Reading what Redis stores and answers: a lease value, and the error for
//! an answer of the wrong shape.

use lease_api::backend::OwnerId;
use lease_api::{FencingToken, LeaseError};
use redis::Value;

/// A stored lease value: owner, token and, when recorded, the holder label.
pub(crate) fn parse_value(v: &str) -> Option<(OwnerId, FencingToken, Option<String>)> {
    let (owner, rest) = v.split_once(':')?;
    let (token, holder) = match rest.split_once(':') {
        Some((t, h)) => (t, Some(h.to_owned())),
        None => (rest, None),
    };
    Some((
        OwnerId::from_hex(owner)?,
        FencingToken(token.parse().ok()?),
        holder,
    ))
}

pub(crate) fn unexpected(what: &str, v: &Value) -> LeaseError {
    LeaseError::protocol(format!("unexpected answer to {what}: {v:?}"))
}
