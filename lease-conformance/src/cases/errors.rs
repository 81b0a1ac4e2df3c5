//! C14: a store that is down.

use super::*;

pub(super) async fn unreachable_store_is_unavailable(ctx: Ctx) -> CaseResult {
    let bound = ctx.factory.unavailable_within() + TOLERANCE;
    let started = Instant::now();
    let p = match tokio::time::timeout(bound, ctx.factory.unreachable()).await {
        Err(_) => {
            return Err(CaseError(format!(
                "building a provider for a down store hung past {bound:?}"
            )));
        }
        Ok(Err(e @ LeaseError::Unavailable { .. })) => {
            // Refusing to build against a down store is a fine answer too.
            check!(
                started.elapsed() < bound,
                "took {:?}: {e}",
                started.elapsed()
            );
            return Ok(());
        }
        Ok(r) => r?,
    };
    let key = ctx.key("down")?;
    let ttl = long_ttl(&*p);
    let started = Instant::now();
    match tokio::time::timeout(bound, p.try_acquire(&key, ttl)).await {
        Err(_) => {
            return Err(CaseError(format!(
                "try_acquire on a down store hung past {bound:?}"
            )));
        }
        Ok(Err(LeaseError::Unavailable { .. })) => {}
        // On a loaded machine a refused connection can reach the provider
        // after its own request bound: a Timeout inside the bound is the
        // same transient answer (C14).
        Ok(Err(LeaseError::Timeout { .. })) => {}
        Ok(other) => {
            return Err(CaseError(format!(
                "try_acquire on a down store gave {other:?}"
            )));
        }
    }
    check!(
        started.elapsed() < bound,
        "failing took {:?}",
        started.elapsed()
    );
    match tokio::time::timeout(bound, p.inspect(&key)).await {
        Err(_) => Err(CaseError(format!(
            "inspect on a down store hung past {bound:?}"
        ))),
        Ok(Err(LeaseError::Unavailable { .. })) => Ok(()),
        Ok(other) => Err(CaseError(format!("inspect on a down store gave {other:?}"))),
    }
}
