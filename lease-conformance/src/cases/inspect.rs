//! C13: inspect and holder labels.

use super::*;

pub(super) async fn inspect_reports_holder_and_free_key(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("inspect")?;
    check!(
        p.inspect(&key).await?.is_none(),
        "a never-used key shows a holder"
    );
    let ttl = long_ttl(&*p);
    let l = must_acquire(&*p, &key, ttl).await?;
    let info = other
        .inspect(&key)
        .await?
        .ok_or_else(|| CaseError("held key shows no holder".into()))?;
    check!(
        info.token == l.token(),
        "inspect token {} != {}",
        info.token,
        l.token()
    );
    let gran = p.capabilities().ttl_granularity;
    check!(
        info.remaining <= ttl + gran,
        "remaining {:?} above TTL {ttl:?}",
        info.remaining
    );
    check!(
        info.remaining + gran + TOLERANCE >= ttl,
        "remaining {:?} far below TTL {ttl:?}",
        info.remaining
    );
    if let Some(owner) = info.owner {
        check!(owner == l.owner(), "inspect owner differs");
    }
    check!(
        info.holder.as_deref() == Some(l.holder()),
        "inspect holder {:?} != the lease's {:?}",
        info.holder,
        l.holder()
    );
    // Inspect changes nothing: still held, same token.
    must_be_held(&*other, &key, ttl).await?;
    p.release(&l).await?;
    check!(
        other.inspect(&key).await?.is_none(),
        "released key shows a holder"
    );
    Ok(())
}

pub(super) async fn holder_label_is_recorded_and_kept_by_extend(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let other = ctx.provider().await?;
    let key = ctx.key("holder-label")?;
    let ttl = long_ttl(&*p);
    let l = must_acquire(&*p, &key, ttl).await?;
    let label = lease_api::holder();
    check!(
        l.holder() == &*label,
        "the lease says holder {:?}, the process is {label:?}",
        l.holder()
    );
    let shown = |info: Option<lease_api::LeaseInfo>| info.and_then(|i| i.holder);
    let seen = shown(other.inspect(&key).await?);
    check!(
        seen.as_deref() == Some(&*label),
        "inspect shows holder {seen:?}, expected {label:?}"
    );
    // The same TTL (etcd: a keep-alive) and another one (etcd: a new etcd
    // lease; ZooKeeper and Redlock rewrite the holder's record).
    let gran = p
        .capabilities()
        .ttl_granularity
        .max(Duration::from_millis(1));
    let l = p.extend(&l, ttl).await?;
    let l = p.extend(&l, ttl + gran).await?;
    check!(
        l.holder() == &*label,
        "extend changed the lease's holder label"
    );
    let seen = shown(other.inspect(&key).await?);
    check!(
        seen.as_deref() == Some(&*label),
        "after extends inspect shows holder {seen:?}, expected {label:?}"
    );
    p.release(&l).await?;
    Ok(())
}
