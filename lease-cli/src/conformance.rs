//! `lease conformance`: the conformance suite against the configured store,
//! in namespaces of this run's own, with a table or JSON report.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use lease_conformance::ProviderFactory;
use leases::{LeaseError, LeaseKey, LeaseProvider, Store, StoreConfig};

use crate::exit::{EXIT_USAGE, describe, error_code, fail};

struct ConfiguredFactory {
    store: Store,
    config: StoreConfig,
    memory: leases::MemoryStore,
    /// This run's own segment: every case namespace is `<ns>.<run>.<case ns>`,
    /// so one purge of `<ns>.<run>.` at the end removes all of it, and
    /// concurrent runs in one namespace never touch each other's records.
    run: String,
}

impl ConfiguredFactory {
    /// Removes every record this run left: one purge per run, not per case
    /// (on Redis a purge is a SCAN of the whole keyspace).
    async fn purge_run(&self) -> Result<u64, LeaseError> {
        let prefix = format!("{}.{}.", self.config.namespace, self.run);
        if self.store == Store::Memory {
            return self.memory.purge_namespaces(&prefix);
        }
        self.store
            .purge_namespaces(
                &prefix,
                self.config.connect_timeout,
                self.config.request_timeout,
            )
            .await
    }
}

#[async_trait::async_trait]
impl ProviderFactory for ConfiguredFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        // Every case namespace lives under the configured one (--namespace).
        let namespace = format!("{}.{}.{namespace}", self.config.namespace, self.run);
        if self.store == Store::Memory {
            return Ok(Arc::new(self.memory.provider(&namespace)?));
        }
        self.store.build(
            &namespace,
            self.config.connect_timeout,
            self.config.request_timeout,
        )
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        if self.store == Store::Memory {
            let down = leases::MemoryStore::new();
            down.set_down(true);
            return Ok(Arc::new(down.provider("unreachable")?));
        }
        let short = Duration::from_millis(500);
        self.store.unreachable().build("unreachable", short, short)
    }

    fn unavailable_within(&self) -> Duration {
        Duration::from_secs(3)
    }
}

fn capabilities_json(c: &leases::Capabilities) -> serde_json::Value {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    serde_json::json!({
        "backend": c.backend,
        "min_ttl_ms": ms(c.min_ttl),
        "max_ttl_ms": ms(c.max_ttl),
        "ttl_granularity_ms": ms(c.ttl_granularity),
        "expiry_slack_ms": ms(c.expiry_slack),
        "durable_tokens": format!("{:?}", c.durable_tokens),
        "notifications": format!("{:?}", c.notifications),
        "expiry_clock": format!("{:?}", c.expiry_clock),
        "holder_session_ms": c.holder_session.map(ms),
        "failover_extension": c.failover_extension.map(|f| format!("{} x TTL + {:?}", f.ttl_multiple, f.fixed)),
        "failover": c.failover.as_ref().map(|f| serde_json::json!({
            "tokens": format!("{:?}", f.tokens),
            "lease_survives": f.lease_survives,
            "recovery_ms": ms(f.recovery),
        })),
    })
}

/// `lease conformance`: runs the suite, prints the report, purges the run's records.
pub(crate) async fn conformance(config: &StoreConfig, json: bool) -> ExitCode {
    let store = match config.parsed() {
        Ok(s) => s,
        Err(e) => return fail(EXIT_USAGE, describe(&e)),
    };
    let factory = Arc::new(ConfiguredFactory {
        store: store.clone(),
        config: config.clone(),
        memory: leases::MemoryStore::new(),
        run: format!("run-{}", &leases::backend::OwnerId::random().to_hex()[..12]),
    });
    // A store that cannot be reached fails at once, not as 36 failed cases.
    let probe = match factory.provider("probe").await {
        Ok(p) => p,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let reachable = match LeaseKey::new("lease-conformance-probe") {
        Ok(k) => probe.inspect(&k).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = reachable {
        return fail(error_code(&e), describe(&e));
    }
    let caps = probe.capabilities().clone();
    if !json {
        println!(
            "conformance suite against {} (namespace {})",
            store.kind(),
            config.namespace
        );
        println!("declared capabilities: {}", capabilities_json(&caps));
    }
    let started = std::time::Instant::now();
    let report = lease_conformance::run_all(Arc::clone(&factory) as Arc<dyn ProviderFactory>).await;
    // Everything the cases and the reachability probe left, in one purge.
    if let Err(e) = factory.purge_run().await {
        eprintln!(
            "lease: could not remove this run's records: {}",
            describe(&e)
        );
    }
    let passed = report.cases.len() - report.failures();
    if json {
        let cases: Vec<_> = report
            .cases
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "clause": c.clause,
                    "passed": c.failure.is_none(),
                    "failure": c.failure,
                    "seconds": c.elapsed.as_secs_f64(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({
                "store": store.kind(),
                "namespace": config.namespace,
                "capabilities": capabilities_json(&caps),
                "passed": passed,
                "failed": report.failures(),
                "cases": cases,
            })
        );
    } else {
        let width = report.cases.iter().map(|c| c.name.len()).max().unwrap_or(4);
        println!(
            "{:<width$}  {:<6}  {:<6}  {:>8}",
            "case", "clause", "result", "time"
        );
        for c in &report.cases {
            let result = if c.failure.is_none() { "ok" } else { "FAILED" };
            println!(
                "{:<width$}  {:<6}  {:<6}  {:>7.2}s",
                c.name,
                c.clause,
                result,
                c.elapsed.as_secs_f64()
            );
        }
        for c in report.cases.iter().filter(|c| c.failure.is_some()) {
            println!("\n{}: {}", c.name, c.failure.as_deref().unwrap_or_default());
        }
        println!(
            "\nconformance: {passed} passed, {} failed in {:.1}s",
            report.failures(),
            started.elapsed().as_secs_f64()
        );
    }
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
