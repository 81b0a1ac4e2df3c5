//! The script verbs: `lease acquire`, `extend`, `release` and `check`, for
//! leases a shell script holds across separate `lease` processes.

use std::process::ExitCode;
use std::time::Duration;

use leases::{AcquireOptions, LeaseError, LeaseKey, StoreConfig, acquire};

use crate::cli::HeldLease;
use crate::exit::{
    EXIT_LOST, EXIT_NOT_ACQUIRED, FLUSH_LIMIT, describe, error_code, fail, lease_code,
};
use crate::status::held_by;
use crate::store::{detachable_store, shared_store};

impl HeldLease {
    fn lease(&self, ttl: Duration) -> Result<leases::Lease, LeaseError> {
        let owner = leases::backend::OwnerId::from_hex(&self.owner).ok_or_else(|| {
            LeaseError::Config(format!("owner {:?} is not 32 hex digits", self.owner))
        })?;
        Ok(leases::Lease::new(
            LeaseKey::new(self.key.as_str())?,
            leases::FencingToken(self.token),
            owner,
            ttl,
            tokio::time::Instant::now(),
        )
        .with_handle(self.handle))
    }
}

/// Single-quotes `s` for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn print_lease(lease: &leases::Lease, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({
                "key": lease.key().as_str(),
                "token": lease.token().get(),
                "owner": lease.owner().to_hex(),
                "handle": lease.handle().to_string(),
                "holder": lease.holder(),
                "ttl_ms": u64::try_from(lease.ttl().as_millis()).unwrap_or(u64::MAX),
                "valid_for_ms": u64::try_from(lease.remaining().as_millis()).unwrap_or(u64::MAX),
            })
        );
    } else {
        println!("LEASE_KEY={}", shell_quote(lease.key().as_str()));
        println!("LEASE_TOKEN={}", lease.token());
        println!("LEASE_OWNER={}", lease.owner().to_hex());
        println!("LEASE_HANDLE={}", lease.handle());
        // Shown, not exported: a later `lease` in the same shell records its
        // own holder label unless told otherwise.
        println!("LEASE_HOLDER={}", shell_quote(lease.holder()));
        println!("export LEASE_KEY LEASE_TOKEN LEASE_OWNER LEASE_HANDLE");
    }
}

/// `lease acquire`: prints the lease for `eval` or as JSON.
pub(crate) async fn script_acquire(
    config: &StoreConfig,
    key: &str,
    ttl: Duration,
    wait: Duration,
    json: bool,
) -> ExitCode {
    let (provider, key) = match detachable_store(config).and_then(|p| Ok((p, LeaseKey::new(key)?)))
    {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let acquired = acquire(&provider, &key, AcquireOptions::ttl(ttl).wait(wait)).await;
    provider.flush(FLUSH_LIMIT).await;
    match acquired {
        Ok(Some(lease)) => {
            print_lease(&lease, json);
            ExitCode::SUCCESS
        }
        Ok(None) => fail(
            EXIT_NOT_ACQUIRED,
            format!("{}; not acquired", held_by(&*provider, &key).await),
        ),
        Err(e) => fail(error_code(&e), describe(&e)),
    }
}

/// `lease extend`: extends a lease `acquire` printed to store-now + `ttl`.
pub(crate) async fn script_extend(
    config: &StoreConfig,
    held: &HeldLease,
    ttl: Duration,
) -> ExitCode {
    let (provider, lease) = match detachable_store(config).and_then(|p| Ok((p, held.lease(ttl)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    match provider.extend(&lease, ttl).await {
        Ok(lease) => {
            print_lease(&lease, false);
            ExitCode::SUCCESS
        }
        Err(e) => fail(lease_code(&e), describe(&e)),
    }
}

/// `lease release`: releases a lease `acquire` printed.
pub(crate) async fn script_release(config: &StoreConfig, held: &HeldLease) -> ExitCode {
    let (provider, lease) =
        match detachable_store(config).and_then(|p| Ok((p, held.lease(config.default_ttl)?))) {
            Ok(v) => v,
            Err(e) => return fail(error_code(&e), describe(&e)),
        };
    match provider.release(&lease).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(lease_code(&e), describe(&e)),
    }
}

/// `lease check`: exit 0 only while `token` holds `key`.
pub(crate) async fn script_check(config: &StoreConfig, key: &str, token: u64) -> ExitCode {
    let (provider, key) = match shared_store(config).and_then(|p| Ok((p, LeaseKey::new(key)?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    match provider.inspect(&key).await {
        Ok(Some(i)) if i.token.get() == token => ExitCode::SUCCESS,
        Ok(Some(i)) => fail(
            EXIT_LOST,
            format!("{key} is held under token {}, not {token}", i.token),
        ),
        Ok(None) => fail(
            EXIT_LOST,
            format!("{key} is free; token {token} does not hold it"),
        ),
        Err(e) => fail(error_code(&e), describe(&e)),
    }
}
