//! C8, C12: fencing tokens and the fence gate.

use super::*;

pub(super) async fn tokens_increase_after_release(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let key = ctx.key("reacquire")?;
    let ttl = long_ttl(&*p);
    let mut last = None;
    for _ in 0..5 {
        let l = must_acquire(&*p, &key, ttl).await?;
        if let Some(prev) = last {
            check!(l.token() > prev, "token {} after {prev}", l.token());
        }
        last = Some(l.token());
        p.release(&l).await?;
    }
    Ok(())
}

pub(super) async fn tokens_increase_on_takeover(ctx: Ctx) -> CaseResult {
    let key = ctx.key("takeover-token")?;
    let t = takeover(&ctx, &key).await?;
    check!(
        t.new.token() > t.old.token(),
        "token {} after {}",
        t.new.token(),
        t.old.token()
    );
    t.new_provider.release(&t.new).await?;
    Ok(())
}

pub(super) async fn tokens_increase_across_instances(ctx: Ctx) -> CaseResult {
    let providers: Vec<_> = join_all((0..4).map(|_| ctx.provider()))
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let key = ctx.key("instances")?;
    let ttl = long_ttl(&*providers[0]);
    let mut last = None;
    for round in 0..3 {
        for (i, p) in providers.iter().enumerate() {
            let l = must_acquire(&**p, &key, ttl).await?;
            if let Some(prev) = last {
                check!(
                    l.token() > prev,
                    "round {round}, instance {i}: token {} after {prev}",
                    l.token()
                );
            }
            last = Some(l.token());
            p.release(&l).await?;
        }
    }
    Ok(())
}

pub(super) async fn fence_gate_rejects_older_holder(ctx: Ctx) -> CaseResult {
    let key = ctx.key("fence")?;
    let t = takeover(&ctx, &key).await?;
    let gate = FenceGate::new();
    check!(
        gate.admit(&key, t.old.token()).is_ok(),
        "the first holder's write was refused"
    );
    check!(
        gate.admit(&key, t.new.token()).is_ok(),
        "the new holder's write was refused"
    );
    match gate.admit(&key, t.old.token()) {
        Err(stale) => check!(stale.highest == t.new.token(), "gate reports {stale}"),
        Ok(()) => {
            return Err(CaseError(
                "the stale holder's late write was admitted".into(),
            ));
        }
    }
    t.new_provider.release(&t.new).await?;
    Ok(())
}
