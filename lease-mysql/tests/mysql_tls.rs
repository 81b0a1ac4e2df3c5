//! TLS with `ssl-mode=verify_identity` and a CA made at test time, against a
//! private MariaDB that takes TCP clients only over TLS
//! (`require_secure_transport`) and a login that requires it: leases work;
//! a wrong password, a plain connection, an untrusted CA and a certificate
//! for another host name are `Denied` within the timeout, never
//! `Unavailable`, and no message shows the password.

use std::path::Path;
use std::time::Duration;

use lease_api::{LeaseKey, LeaseProvider};
use lease_mysql::{MysqlConfig, MysqlProvider};
use lease_testkit::{TestCa, assert_denied, owned_mysql_tls, unique, until_ok};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_identity_tls_works_and_refusals_are_denied() {
    let ca = TestCa::new();
    let server = owned_mysql_tls(&ca, "tls-pw");
    let at = |host: &str, password: &str, query: String| {
        format!(
            "mysql://tls:{password}@{host}:{}/lease?{query}",
            server.port()
        )
    };
    let verify = |ca_file: &Path| format!("ssl-mode=verify_identity&ssl-ca={}", ca_file.display());
    let make = |url: String| {
        MysqlProvider::new(
            MysqlConfig::new(url).timeouts(Duration::from_secs(2), Duration::from_secs(2)),
        )
        .unwrap()
    };
    let good = make(at("127.0.0.1", "tls-pw", verify(&ca.ca())));
    let k = LeaseKey::new(unique("tls")).unwrap();
    // The server is known to listen; it serves once its start-up is done.
    let lease = until_ok(|| good.try_acquire(&k, TTL))
        .await
        .into_lease()
        .expect("a free key over TLS");
    good.release(&lease).await.unwrap();

    let other_ca = TestCa::new();
    for (what, url) in [
        (
            "a wrong password",
            at("127.0.0.1", "wrong", verify(&ca.ca())),
        ),
        (
            "a plain connection",
            at("127.0.0.1", "tls-pw", "ssl-mode=disabled".into()),
        ),
        (
            "an untrusted CA",
            at("127.0.0.1", "tls-pw", verify(&other_ca.ca())),
        ),
        // The certificate names localhost and 127.0.0.1, not this address.
        (
            "another host name",
            at("127.0.0.2", "tls-pw", verify(&ca.ca())),
        ),
    ] {
        assert_denied(what, &make(url), &k, "tls-pw", Duration::from_secs(5)).await;
    }
}
