//! The factory for the in-memory provider.

use std::sync::Arc;

use async_trait::async_trait;
use lease_api::{LeaseError, LeaseProvider, MemoryStore};

use crate::ProviderFactory;

/// Makes [`MemoryProvider`](lease_api::MemoryProvider)s that share one store, the
/// in-memory analogue of several connections to one server.
#[derive(Clone, Debug, Default)]
pub struct MemoryFactory {
    store: MemoryStore,
}

impl MemoryFactory {
    /// A factory over a new store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl ProviderFactory for MemoryFactory {
    async fn provider(&self, namespace: &str) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        Ok(Arc::new(self.store.provider(namespace)?))
    }

    async fn unreachable(&self) -> Result<Arc<dyn LeaseProvider>, LeaseError> {
        let down = MemoryStore::new();
        down.set_down(true);
        Ok(Arc::new(down.provider("unreachable")?))
    }
}
