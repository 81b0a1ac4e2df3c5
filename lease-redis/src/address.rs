//! Redis URLs: a client opened for one (TLS roots included), and a URL
//! described for people without its password.

use lease_api::{LeaseError, Result};

/// A URL for logs and errors: scheme, host and port only.
pub(crate) fn describe(url: &str) -> String {
    // Never show a password: keep scheme, host and port only.
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
            let host = host.split(['/', '?']).next().unwrap_or(host);
            format!("{scheme}://{host}")
        }
        None => "redis server".into(),
    }
}

/// Opens a client for `url`. `rediss://` verifies the server's certificate
/// against the system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured),
/// or against the CA in the PEM file named by a `ca=` query parameter.
pub(crate) fn open_client(url: &str, display: &str) -> Result<redis::Client> {
    let bad = |e: &dyn std::fmt::Display| {
        LeaseError::Config(format!(
            "invalid Redis URL {display:?} ({e}); expected redis://[user:password@]host[:port][/db] or rediss://...[?ca=/path/ca.pem]"
        ))
    };
    let mut parsed = url::Url::parse(url).map_err(|e| bad(&e))?;
    let ca = parsed
        .query_pairs()
        .find(|(k, _)| k == "ca")
        .map(|(_, v)| v.into_owned());
    let Some(ca) = ca else {
        // rustls needs its crypto provider chosen once per process.
        if parsed.scheme() == "rediss" {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        return redis::Client::open(url).map_err(|e| bad(&e));
    };
    if parsed.scheme() != "rediss" {
        return Err(LeaseError::Config(format!(
            "{display}: ca= is for TLS; use rediss://"
        )));
    }
    let rest: Vec<(String, String)> = parsed
        .query_pairs()
        .filter(|(k, _)| k != "ca")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    parsed.set_query(None);
    if !rest.is_empty() {
        parsed.query_pairs_mut().extend_pairs(rest);
    }
    let root = std::fs::read(&ca).map_err(|e| {
        LeaseError::Config(format!("{display}: cannot read the CA file {ca:?}: {e}"))
    })?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    redis::Client::build_with_tls(
        parsed.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root),
        },
    )
    .map_err(|e| bad(&e))
}
