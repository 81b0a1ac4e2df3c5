//! The whole conformance suite against the in-memory provider.

use lease_conformance::{MemoryFactory, conformance_tests};

conformance_tests!(memory_conformance, MemoryFactory::new());

#[tokio::test]
async fn the_macro_lists_every_case() {
    // Every case in CASES must have a test above; a report covers them all.
    let report = lease_conformance::run_all(std::sync::Arc::new(MemoryFactory::new())).await;
    assert_eq!(report.cases.len(), lease_conformance::CASES.len());
    assert!(
        report.passed(),
        "{:#?}",
        report
            .cases
            .iter()
            .filter(|c| c.failure.is_some())
            .collect::<Vec<_>>()
    );
}
