//! `lease chaos`: one chaos cell of lease-chaos against the configured store.

use std::process::ExitCode;

use leases::StoreConfig;

use crate::exit::{EXIT_USAGE, fail};

/// `lease chaos`: one chaos cell against the configured store; the workers
/// are this program again, started with the hidden `chaos-worker` command.
pub(crate) async fn chaos(config: &StoreConfig, options: lease_chaos::ChaosOptions) -> ExitCode {
    let args = lease_chaos::RunArgs {
        store: config.store.clone(),
        namespace: config.namespace.clone(),
        options,
    };
    match lease_chaos::run_and_print(args).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(EXIT_USAGE, e),
    }
}
