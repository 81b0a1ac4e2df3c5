//! C1: keys and namespaces.

use super::*;

pub(super) async fn keys_are_independent(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let keys = [
        ctx.key("a")?,
        ctx.key("ab")?,
        ctx.key("a/b")?,
        ctx.key("b")?,
    ];
    let mut leases = Vec::new();
    for k in &keys {
        leases.push(must_acquire(&*p, k, ttl).await?);
    }
    p.release(&leases[0]).await?;
    for (k, l) in keys.iter().zip(&leases).skip(1) {
        let info = p.inspect(k).await?;
        check!(
            info.map(|i| i.token) == Some(l.token()),
            "releasing {:?} changed {k:?}",
            keys[0]
        );
    }
    check!(
        p.inspect(&keys[0]).await?.is_none(),
        "released key still shows a holder"
    );
    for l in &leases[1..] {
        p.release(l).await?;
    }
    Ok(())
}

pub(super) async fn namespaces_are_isolated(ctx: Ctx) -> CaseResult {
    let a = ctx.provider_in("a").await?;
    let b = ctx.provider_in("b").await?;
    let ab = ctx.provider_in("a:b").await?;
    let key = ctx.key("shared-name")?;
    let ttl = long_ttl(&*a);
    let la = must_acquire(&*a, &key, ttl).await?;
    let lb = must_acquire(&*b, &key, ttl).await?;
    let lab = must_acquire(&*ab, &key, ttl).await?;
    check!(
        a.inspect(&key).await?.map(|i| i.token) == Some(la.token()),
        "namespace a sees another holder"
    );
    a.release(&la).await?;
    check!(
        b.inspect(&key).await?.map(|i| i.token) == Some(lb.token()),
        "release in a freed b"
    );
    match b.release(&la).await {
        Err(LeaseError::NotHeld { .. }) => {}
        other => {
            return Err(CaseError(format!(
                "a lease from namespace a released in b: {other:?}"
            )));
        }
    }
    b.release(&lb).await?;
    ab.release(&lab).await?;
    Ok(())
}

pub(super) async fn unusual_keys_work_and_stay_distinct(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    let ttl = long_ttl(&*p);
    let names = [
        "/",
        "//",
        "a/b",
        "a%2Fb",
        "a\\/b",
        "a_b",
        "a b",
        "a\tb",
        "a\nb",
        ".",
        "..",
        "../x",
        "%2E%2E",
        "*",
        "?",
        "[ab]",
        "{x}",
        "{",
        "}",
        "a{b}c",
        "'",
        "\"",
        "`",
        "' OR 1=1 --",
        "%",
        "_",
        "\\",
        " ",
        "  ",
        "é",
        "e\u{301}",
        "🔒",
        "zookeeper",
        "A",
        "a",
        "a:b",
        "a::b",
        "a|b",
        "a.b",
    ];
    let mut keys: Vec<LeaseKey> = names.iter().map(|n| ctx.key(n)).collect::<Result<_, _>>()?;
    // Keys that are entirely unusual, without the case prefix.
    keys.push(LeaseKey::new(format!("{}\u{1F600}", ctx.prefix))?);
    // Two keys of exactly 512 bytes that differ only in their last byte.
    let base = format!("{}/", ctx.prefix);
    let fill = MAX_KEY_BYTES - base.len() - 1;
    keys.push(LeaseKey::new(format!(
        "{base}{}x",
        "é".repeat(fill / 2) + &"y".repeat(fill % 2)
    ))?);
    keys.push(LeaseKey::new(format!(
        "{base}{}z",
        "é".repeat(fill / 2) + &"y".repeat(fill % 2)
    ))?);
    check!(
        keys[keys.len() - 1].as_str().len() == MAX_KEY_BYTES,
        "test bug: not a 512-byte key"
    );
    let mut leases = Vec::new();
    for k in &keys {
        match p.try_acquire(k, ttl).await? {
            TryAcquire::Acquired(l) => leases.push(l),
            TryAcquire::Held { .. } => {
                return Err(CaseError(format!("key {k:?} collided with an earlier key")));
            }
        }
    }
    for l in &leases {
        let info = p.inspect(l.key()).await?;
        check!(
            info.map(|i| i.token) == Some(l.token()),
            "inspect of {:?} shows another lease",
            l.key()
        );
    }
    for l in &leases {
        p.release(l).await?;
        check!(
            p.inspect(l.key()).await?.is_none(),
            "{:?} still held after release",
            l.key()
        );
    }
    Ok(())
}

pub(super) async fn unusual_namespaces_work_and_stay_distinct(ctx: Ctx) -> CaseResult {
    // Pairs that a naive "namespace/key" or "namespace|key" join would merge.
    let pairs = [
        ("a/b", "c", "a", "b/c"),
        ("a|b", "c", "a", "b|c"),
        ("a%2Fb", "c", "a/b", "c"),
        ("a b", "c d", "a", "b c d"),
        ("ünï🔒", "k", "ünï", "🔒/k"),
        ("a:b", "c", "a", "b:c"),
    ];
    for (ns1, k1, ns2, k2) in pairs {
        let p1 = ctx.provider_in(ns1).await?;
        let p2 = ctx.provider_in(ns2).await?;
        let (key1, key2) = (LeaseKey::new(k1)?, LeaseKey::new(k2)?);
        let ttl = long_ttl(&*p1);
        let l1 = must_acquire(&*p1, &key1, ttl).await?;
        let l2 = must_acquire(&*p2, &key2, ttl).await.map_err(|e| {
            CaseError(format!(
                "({ns1:?}, {k1:?}) and ({ns2:?}, {k2:?}) collide: {e}"
            ))
        })?;
        // The same namespace still sees its own lease.
        let p1b = ctx.provider_in(ns1).await?;
        must_be_held(&*p1b, &key1, ttl).await?;
        check!(
            p1b.inspect(&key1).await?.map(|i| i.token) == Some(l1.token()),
            "namespace {ns1:?} does not see its own lease"
        );
        p1.release(&l1).await?;
        p2.release(&l2).await?;
    }
    Ok(())
}

pub(super) async fn invalid_keys_are_rejected(ctx: Ctx) -> CaseResult {
    let p = ctx.provider().await?;
    for bad in [
        String::new(),
        "k".repeat(MAX_KEY_BYTES + 1),
        "nul\0inside".into(),
        "\0".into(),
    ] {
        match LeaseKey::new(&bad) {
            Err(LeaseError::InvalidKey { reason }) => check!(!reason.is_empty(), "empty reason"),
            other => return Err(CaseError(format!("key {bad:?} gave {other:?}"))),
        }
    }
    // The longest valid key works end to end.
    let edge = LeaseKey::new(format!(
        "{}{}",
        ctx.prefix,
        "k".repeat(MAX_KEY_BYTES - ctx.prefix.len())
    ))?;
    let l = must_acquire(&*p, &edge, long_ttl(&*p)).await?;
    p.release(&l).await?;
    Ok(())
}
