//! `lease status`: who holds a key, and the "held by" line other commands print.

use std::process::ExitCode;
use std::time::Duration;

use leases::{LeaseKey, LeaseProvider, StoreConfig};

use crate::exit::{EXIT_FREE, describe, error_code, fail};
use crate::store::shared_store;

/// `lease status`: exit 0 when KEY is held, 3 when it is free.
pub(crate) async fn status(config: &StoreConfig, key: &str, json: bool) -> ExitCode {
    let (provider, key) = match shared_store(config).and_then(|p| Ok((p, LeaseKey::new(key)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let info = match provider.inspect(&key).await {
        Ok(i) => i,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let held = info.is_some();
    if json {
        let value = match &info {
            Some(i) => serde_json::json!({
                "key": key.as_str(),
                "held": true,
                "token": i.token.get(),
                "remaining_ms": u64::try_from(i.remaining.as_millis()).unwrap_or(u64::MAX),
                "owner": i.owner.map(|o| o.to_hex()),
                "holder": i.holder,
            }),
            None => serde_json::json!({ "key": key.as_str(), "held": false }),
        };
        println!("{value}");
    } else {
        match info {
            Some(i) => println!(
                "{key}: held by {}, token {}, {} remaining",
                i.holder.as_deref().unwrap_or("an unnamed holder"),
                i.token,
                humantime::format_duration(round_ms(i.remaining))
            ),
            None => println!("{key}: free"),
        }
    }
    if held {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FREE)
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// "KEY is held by HOLDER (token T, D left)", as far as the store says.
pub(crate) async fn held_by(provider: &dyn LeaseProvider, key: &LeaseKey) -> String {
    match provider.inspect(key).await {
        Ok(Some(i)) => format!(
            "{key} is held by {} (token {}, {} left)",
            i.holder.as_deref().unwrap_or("someone else"),
            i.token,
            humantime::format_duration(round_ms(i.remaining))
        ),
        _ => format!("{key} is held by someone else"),
    }
}
