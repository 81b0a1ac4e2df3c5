//! What the server promises: the probe of token durability (`fsync`,
//! `synchronous_commit`) and, with several hosts, of what a promotion keeps.

use lease_api::{Capabilities, Failover, FailoverTokens, Result, TokenDurability};
use sqlx::Row;

use crate::provider::PostgresProvider;

impl PostgresProvider {
    /// With several hosts, or Patroni named, the first call waits for the
    /// probe, so the capabilities read after it carry the failover
    /// declaration. A probe that fails is tried again by the next call.
    pub(crate) async fn probe_first(&self) {
        if self.inner.hosts.is_multi() || !self.inner.patroni.is_empty() {
            let _ = self
                .inner
                .probed_first
                .get_or_try_init(|| async { self.probe().await.map(|_| ()) })
                .await;
        }
    }
    /// Asks the server whether committed rows survive a crash (`fsync`,
    /// `synchronous_commit`) and returns the capabilities with that answer.
    /// The first answer is also what
    /// [`capabilities`](lease_api::LeaseProvider::capabilities) reports for
    /// the provider's life; a later call returns what it finds then (after
    /// a failover, or a change of Patroni's settings), which `capabilities`
    /// does not follow. Happens by itself in the background on first use.
    ///
    /// # Errors
    /// `Unavailable` when the database cannot be reached.
    pub async fn probe(&self) -> Result<Capabilities> {
        if self.inner.hosts.is_multi() {
            // Find the primary before the pool is used: the first host
            // listed may be a standby.
            self.bounded(
                "finding the primary",
                self.inner.hosts.connect_primary(|o| o),
            )
            .await?;
        }
        let row = self
            .bounded(
                "the probe",
                sqlx::query(
                    "SELECT current_setting('fsync'), current_setting('synchronous_commit')",
                )
                .fetch_one(self.pool()?),
            )
            .await?;
        let fsync: String = row.try_get(0).unwrap_or_default();
        let sync_commit: String = row.try_get(1).unwrap_or_default();
        let durable_tokens = if fsync != "on" {
            TokenDurability::Volatile(format!(
                "fsync is {fsync}: a clean restart keeps tokens, a crash of the server can lose recent rows and reissue tokens"
            ))
        } else if sync_commit == "off" {
            TokenDurability::Volatile(
                "synchronous_commit is off: a crash can lose the last transactions and reissue tokens".into(),
            )
        } else {
            TokenDurability::Durable(
                "tokens are committed rows (fsync on, synchronous commit); released rows keep them"
                    .into(),
            )
        };
        // One host with Patroni named is a cluster behind a proxy or a
        // virtual address: it fails over too.
        if !self.inner.hosts.is_multi() && self.inner.patroni.is_empty() {
            return Ok(self.inner.caps.record(durable_tokens));
        }
        let failover = self.probe_failover().await?;
        Ok(self.inner.caps.record_with(|c| {
            c.with_durable_tokens(durable_tokens)
                .with_failover(Some(failover))
        }))
    }

    /// With several hosts: whether the primary's commits wait for a standby
    /// (`synchronous_standby_names`, `synchronous_commit`, and a standby
    /// streaming as `sync` or `quorum` now), which decides what a promotion
    /// keeps.
    async fn probe_failover(&self) -> Result<Failover> {
        let row = self
            .bounded(
                "the replication probe",
                sqlx::query(
                    "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'), \
                     (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))",
                )
                .fetch_one(self.pool()?),
            )
            .await?;
        let names: String = row.try_get(0).unwrap_or_default();
        let commit: String = row.try_get(1).unwrap_or_default();
        let sync_standbys: i64 = row.try_get(2).unwrap_or_default();
        let waits = matches!(commit.as_str(), "on" | "remote_write" | "remote_apply");
        // Counted from the promotion (PostgreSQL has no failover agent of its
        // own: Patroni, repmgr or a managed service promotes a standby): one
        // statement fails on the old primary, and the next connects to each
        // host in turn until one answers as primary.
        let per_host = self.inner.hosts.connect_timeout();
        let hosts = u32::try_from(self.inner.hosts.len()).unwrap_or(u32::MAX);
        let reconnect = self.inner.response_timeout * 2 + per_host.saturating_mul(hosts);
        let replication = Replication {
            names,
            commit,
            waits,
            sync_standbys,
        };
        if !self.inner.patroni.is_empty() {
            return Ok(self.patroni_failover(&replication, reconnect).await);
        }
        let (tokens, synchronous) = replication.tokens();
        Ok(Failover::new(tokens, synchronous, reconnect))
    }

    /// The failover a Patroni cluster promises, from its settings (REST
    /// `GET /config`): it promotes only the standby its sync key names when
    /// `synchronous_mode` is on, so with commits that wait for it no token
    /// is lost, even while PostgreSQL's `synchronous_standby_names` is
    /// empty (Patroni clears it when no standby is in sync, and then
    /// promotes none). Recovery adds Patroni's detection
    /// ([`PatroniSettings::detection`](crate::patroni::PatroniSettings::detection)).
    /// When no REST API answers, Patroni's defaults are assumed for the
    /// time and PostgreSQL's settings decide the tokens. A paused cluster
    /// (`pause: true`) fails over only when a person does: its recovery is
    /// `Duration::MAX`.
    async fn patroni_failover(
        &self,
        replication: &Replication,
        reconnect: std::time::Duration,
    ) -> Failover {
        let Replication { names, commit, .. } = replication;
        let settings =
            crate::patroni::read_settings(&self.inner.patroni, self.inner.response_timeout).await;
        let s = match settings {
            Ok(s) => s,
            Err(why) => {
                let (tokens, synchronous) = replication.tokens();
                let note = format!(
                    "; Patroni's REST API did not answer ({why}): its default times assumed"
                );
                let tokens = noted(tokens, &note);
                let detection = crate::patroni::PatroniSettings::defaults().detection();
                return Failover::new(tokens, synchronous, detection.saturating_add(reconnect));
            }
        };
        let synchronous = s.synchronous_mode && replication.waits;
        let tokens = if synchronous {
            FailoverTokens::Increasing(format!(
                "Patroni's synchronous_mode promotes only the standby its sync key names, which had every \
                 commit (synchronous_commit {commit}; synchronous_standby_names now '{names}')"
            ))
        } else if s.synchronous_mode {
            FailoverTokens::MayRepeat(format!(
                "Patroni's synchronous_mode is on, but synchronous_commit is {commit}: commits do not wait for the standby"
            ))
        } else {
            FailoverTokens::MayRepeat(format!(
                "Patroni promotes an asynchronous standby up to maximum_lag_on_failover ({} bytes of WAL) behind: \
                 the last commits, tokens and leases among them, can be lost",
                s.maximum_lag_on_failover
            ))
        };
        if s.pause {
            // Nothing is promoted until a person acts: no bound to declare.
            let note = "; Patroni is paused (pause: true): it promotes no standby by itself, \
                        so nothing serves after the primary is lost until a person fails over";
            return Failover::new(noted(tokens, note), synchronous, std::time::Duration::MAX);
        }
        Failover::new(tokens, synchronous, s.detection().saturating_add(reconnect))
    }

    pub(crate) fn start_probe(&self) {
        if self.inner.caps.begin() {
            let this = self.clone();
            tokio::spawn(async move {
                if this.probe().await.is_err() {
                    this.inner.caps.failed();
                }
            });
        }
    }
}

/// `tokens` with `note` added to the reason it gives.
fn noted(tokens: FailoverTokens, note: &str) -> FailoverTokens {
    match tokens {
        FailoverTokens::Increasing(t) => FailoverTokens::Increasing(t + note),
        FailoverTokens::MayRepeat(t) => FailoverTokens::MayRepeat(t + note),
        other => other,
    }
}

/// The primary's replication settings, as the probe read them.
struct Replication {
    /// `synchronous_standby_names`.
    names: String,
    /// `synchronous_commit`.
    commit: String,
    /// Whether `synchronous_commit` makes a commit wait for the standby.
    waits: bool,
    /// Standbys streaming as `sync` or `quorum` when probed.
    sync_standbys: i64,
}

impl Replication {
    /// What PostgreSQL's settings alone say a promotion keeps, and whether
    /// leases survive it. The settings decide: with them every commit waits
    /// (blocks, if no standby is there) until a synchronous standby has it.
    /// How many are in sync right now is only reported.
    fn tokens(&self) -> (FailoverTokens, bool) {
        let Replication {
            names,
            commit,
            waits,
            sync_standbys,
        } = self;
        let synchronous = !names.trim().is_empty() && *waits;
        let tokens = if synchronous {
            FailoverTokens::Increasing(format!(
                "every commit, each token's among them, reaches a synchronous standby before it returns \
                 (synchronous_standby_names '{names}', synchronous_commit {commit}; {sync_standbys} in sync when probed)"
            ))
        } else {
            FailoverTokens::MayRepeat(format!(
                "the standbys are asynchronous (synchronous_standby_names '{names}', synchronous_commit {commit}, \
                 {sync_standbys} in sync): a promotion can lose the last commits, tokens and leases among them"
            ))
        };
        (tokens, synchronous)
    }
}
