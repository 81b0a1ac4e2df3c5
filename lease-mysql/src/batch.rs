//! Statement batches: several statements sent as one text query, one round
//! trip, for the claims. Their transactions (lock the rows, draw a token,
//! write, commit) then never stay open across a round trip, so the row
//! holding the token counter is held only while the server runs the batch.
//!
//! A batch carries no bound parameters, so every value in it is written by
//! [`bytes`] (a hex literal: any bytes, nothing to escape) or is a number.

use futures_util::TryStreamExt;
use sqlx::Either;
use sqlx::mysql::{MySqlConnection, MySqlRow};

/// `bytes` as an SQL hex literal, `X'…'`: safe for any content, since hex
/// digits cannot close the quote.
pub(crate) fn bytes(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(3 + 2 * bytes.len());
    out.push_str("X'");
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out.push('\'');
    out
}

/// The rows every statement of `sql` returned, in order. On an error the
/// server ran the statements before the failing one and none after it: a
/// transaction the batch opened may still be open, so the caller must not
/// reuse the connection (a [`Checkout`](crate::conns::Checkout) dropped
/// without `done` is closed, and the server rolls it back).
pub(crate) async fn rows(
    conn: &mut MySqlConnection,
    sql: &str,
) -> Result<Vec<MySqlRow>, sqlx::Error> {
    let mut answers = sqlx::raw_sql(sql).fetch_many(conn);
    let mut rows = Vec::new();
    while let Some(answer) = answers.try_next().await? {
        if let Either::Right(row) = answer {
            rows.push(row);
        }
    }
    Ok(rows)
}

/// Runs `$body` (an async block using the connection `$c`) on a slot's
/// connection, bounded by the response timeout; again (up to 50 times)
/// while the server rolled it back as a deadlock (1213), which undoes the
/// whole transaction. After any error the connection is closed, not
/// reused: a batch that failed midway may have left its transaction open,
/// and closing rolls it back. (A macro, not a function taking an async
/// closure: the future stays `Send` for any caller.)
macro_rules! transaction {
    ($provider:expr, $what:expr, |$c:ident| $body:expr) => {{
        let provider: &crate::MysqlProvider = &$provider;
        provider
            .bounded($what, async {
                let mut tries = 0u64;
                loop {
                    let mut checkout = provider.inner.conns.checkout().await?;
                    let r = {
                        let $c = checkout.conn();
                        $body.await
                    };
                    match r {
                        Ok(v) => {
                            checkout.done(&Ok::<(), sqlx::Error>(()));
                            break Ok(v);
                        }
                        Err(e) => {
                            drop(checkout);
                            if crate::provider::error_number(&e) == Some(1213) && tries < 50 {
                                tries += 1;
                                tokio::time::sleep(std::time::Duration::from_millis(1 + tries % 5))
                                    .await;
                                continue;
                            }
                            break Err(e);
                        }
                    }
                }
            })
            .await
    }};
}

#[cfg(test)]
mod tests {
    #[test]
    fn any_bytes_become_a_closed_hex_literal() {
        assert_eq!(super::bytes(b""), "X''");
        assert_eq!(super::bytes(b"a'; DROP"), "X'61273b2044524f50'");
        assert_eq!(super::bytes("é".as_bytes()), "X'c3a9'");
    }
}
