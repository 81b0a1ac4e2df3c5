//! Runnable examples for the `lease` crates; see the `examples` in this package.
//!
//! Run the quickstart with `cargo run --example quickstart`. It needs no server:
//! it uses the in-memory provider.
//!
//! ```
//! use lease_api::{LeaseKey, MemoryProvider};
//! let _provider = MemoryProvider::new();
//! assert!(LeaseKey::new("batch-1").is_ok());
//! ```
