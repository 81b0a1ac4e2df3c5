//! `lease run`: acquire a key, run the command under the supervisor while the
//! lease is renewed, and stop it when the lease is lost or a signal comes.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use leases::{
    AcquireOptions, GuardConfig, LeaseGuard, LeaseKey, LeaseSetGuard, StoreConfig, acquire,
    acquire_all, acquire_read, acquire_write, end_after_min_hold,
};

use crate::exit::{
    EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SUPERVISOR, EXIT_USAGE,
    FLUSH_LIMIT, describe, error_code, fail,
};
use crate::held::{Held, describe_keys, environment};
use crate::slots::{SlotClaims, claim_slot};
use crate::status::held_by;
use crate::store::shared_store;
use crate::supervise;

/// How long `lease run` waits for a killed command group to die before it
/// gives the lease up.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Finds the program `lease run` would start, before any lease is taken:
/// 127 when it is not found, 126 when it is not an executable file.
fn check_runnable(program: &str) -> Result<(), (u8, String)> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let candidates: Vec<std::path::PathBuf> = if program.contains('/') {
        vec![program.into()]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(program)).collect())
            .unwrap_or_default()
    };
    if candidates.iter().any(|c| executable(c)) {
        return Ok(());
    }
    if candidates.iter().any(|c| c.exists()) {
        return Err((EXIT_NOT_EXECUTABLE, format!("{program}: not executable")));
    }
    Err((EXIT_NOT_FOUND, format!("{program}: command not found")))
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    config: &StoreConfig,
    keys: &[String],
    (options, mode): (AcquireOptions, Mode),
    min_hold: Duration,
    grace: Duration,
    once: Option<(String, Option<Duration>)>,
    cmd: &[String],
) -> ExitCode {
    if let Err((code, msg)) = check_runnable(&cmd[0]) {
        return fail(code, msg);
    }
    let claims = match once
        .as_ref()
        .map(|_| SlotClaims::for_store(config))
        .transpose()
    {
        Ok(c) => c,
        Err(e) => return fail(EXIT_USAGE, describe(&e)),
    };
    let parsed = keys
        .iter()
        .map(LeaseKey::new)
        .collect::<Result<Vec<_>, _>>();
    let (provider, keys) = match shared_store(config).and_then(|p| Ok((p, parsed?))) {
        Ok(v) => v,
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    let Some(key) = keys.first().cloned() else {
        return fail(EXIT_USAGE, "no --key given");
    };
    if keys.len() > 1 && mode != Mode::Plain {
        return fail(
            EXIT_USAGE,
            "--shared and --writer take one --key (a read/write lease is one key's)",
        );
    }
    if keys.len() > 1 && (once.is_some() || !min_hold.is_zero()) {
        return fail(
            EXIT_USAGE,
            "--once-per and --min-hold take one --key; several keys are held together only for the command's run",
        );
    }
    let ttl = options.ttl;
    if let Err(e) = provider.capabilities().grant_ttl(ttl) {
        return fail(EXIT_USAGE, describe(&e));
    }
    let acquired = if keys.len() == 1 {
        match mode {
            Mode::Plain => acquire(&provider, &key, options).await,
            Mode::Read => acquire_read(&provider, &key, options).await,
            Mode::Write => acquire_write(&provider, &key, options).await,
        }
        .map(|l| l.map(|l| vec![l]))
    } else {
        acquire_all(&provider, &keys, options).await
    };
    if !matches!(acquired, Ok(Some(_))) {
        // An attempt that timed out may have left a cancel in flight.
        provider.flush(FLUSH_LIMIT).await;
    }
    let leases = match acquired {
        Ok(Some(leases)) => leases,
        Ok(None) => {
            let mut held = Vec::new();
            if mode != Mode::Plain {
                held.push(rw_holders(&*provider, &key).await);
            }
            for k in keys.iter().filter(|_| mode == Mode::Plain) {
                if provider.inspect(k).await.map_or(true, |i| i.is_some()) {
                    held.push(held_by(&*provider, k).await);
                }
            }
            return fail(
                EXIT_NOT_ACQUIRED,
                format!("{}; not acquired", held.join("; ")),
            );
        }
        Err(e) => return fail(error_code(&e), describe(&e)),
    };
    // From here on SIGTERM, SIGINT and SIGHUP stop the command and release
    // the key. Registered before the command starts: a signal that came
    // after it started and before registration killed this process outright
    // and left the key held until its TTL (a signal that comes before the
    // command starts is acted on as soon as it runs).
    let mut signals = Signals::new();
    // The slot is claimed under the lease, so a run still going from an
    // earlier slot is never overlapped, and a run that finds the key held
    // leaves the slot to the one that holds it.
    let mut claimed = None;
    if let (Some(claims), Some((slot, keep))) = (&claims, &once) {
        match claim_slot(claims, &key, slot, *keep).await {
            Ok(claim) => claimed = Some((claims, slot, claim)),
            Err((code, msg)) => {
                let _ = leases::release_all(&*provider, &leases).await;
                return fail(code, msg);
            }
        }
    }
    let acquired_at = leases
        .iter()
        .map(|l| l.sent_at())
        .min()
        .unwrap_or_else(tokio::time::Instant::now);
    let what = describe_keys(&leases);
    let owned_env = environment(&leases);
    let env: Vec<(&str, String)> = owned_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let guard = match <[_; 1]>::try_from(leases) {
        Ok([lease]) => Held::One(LeaseGuard::with_config(
            Arc::clone(&provider),
            lease,
            GuardConfig::default(),
        )),
        Err(leases) => Held::Set(LeaseSetGuard::new(Arc::clone(&provider), leases)),
    };

    // Where the key is free the moment this process's session ends
    // (PostgreSQL's advisory mode), the supervisor gives the command no
    // grace when this process dies: SIGKILL at once, not at validity.
    let grace_if_gone = if provider.capabilities().holder_session == Some(Duration::ZERO) {
        Duration::ZERO
    } else {
        grace
    };
    let mut supervisor =
        match supervise::Supervisor::spawn(cmd, &env, grace, grace_if_gone, guard.valid_until()) {
            Ok(s) => s,
            Err(e) => {
                // Nothing ran: the slot is not used up.
                if let Some((claims, slot, claim)) = &claimed {
                    let _ = claims.unclaim(key.as_str(), slot, claim).await;
                }
                let _ = guard.release().await;
                return fail(EXIT_USAGE, format!("cannot start {:?}: {e}", cmd[0]));
            }
        };
    // Tell the supervisor until when the lease is surely held, soon after each
    // renewal: within a tenth of the validity window.
    let window = guard.valid_until() - acquired_at;
    let mut tick = tokio::time::interval(
        (window / 10).clamp(Duration::from_millis(2), Duration::from_millis(100)),
    );
    let mut told = guard.valid_until();
    let mut forward = move |supervisor: &mut supervise::Supervisor, guard: &Held| {
        let until = guard.valid_until();
        if until != told {
            told = until;
            supervisor.valid_until(until);
        }
    };
    // The command's process group, known before anything can kill the supervisor.
    let mut group = None;
    for _ in 0..200 {
        group = supervisor.command_group();
        if group.is_some() || supervisor.exited() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut stopping: Option<(u8, String)> = None;
    let exit = loop {
        tokio::select! {
            exit = supervisor.wait() => break exit,
            reason = guard.lost(), if stopping.is_none() => {
                stopping = Some((EXIT_LOST, format!("lease on {what} lost: {reason}; stopping the command")));
            }
            signal = signals.recv(), if stopping.is_none() => {
                stopping = Some((128 + signal.1, format!("got {}; stopping the command and releasing {what}", signal.0)));
            }
            _ = tick.tick() => {
                // Keep the renewals flowing, also while the command is stopping.
                forward(&mut supervisor, &guard);
                group = group.or_else(|| supervisor.command_group());
                continue;
            }
        }
        if let Some((_, msg)) = &stopping {
            eprintln!("lease: {msg}");
            supervisor.stop(grace);
        }
    };
    let code = match exit {
        Ok(supervise::SupervisorExit::Code(c)) => {
            // The supervisor kills what the command left before it exits, but
            // gives up after a while (a process stuck in the kernel, say);
            // whatever it left was re-parented to this process.
            if supervise::has_descendants()
                && !supervise::kill_orphans_and_wait(None, KILL_WAIT).await
            {
                return left_to_expire(
                    guard,
                    format!(
                        "processes the command started outlived it and did not die within {}, so {what} is left to expire",
                        humantime::format_duration(KILL_WAIT)
                    ),
                )
                .await;
            }
            c
        }
        Ok(supervise::SupervisorExit::Killed(sig)) => {
            // The supervisor was killed outright: its command may still run.
            // Stop it before the lease is given up. Without the command's
            // group and without being a subreaper, nothing says it is gone.
            let group = group.or_else(|| supervisor.command_group());
            let stopped = if group.is_none() && !supervisor.adopts_orphans() {
                false
            } else {
                supervise::kill_orphans_and_wait(group, KILL_WAIT).await
            };
            if !stopped {
                // Something of the command still runs: leave the lease to
                // expire on the store rather than hand the key to another.
                return left_to_expire(
                    guard,
                    format!(
                        "the supervisor of the command was killed by signal {sig}; the command's group did not die within {}, so {what} is left to expire",
                        humantime::format_duration(KILL_WAIT)
                    ),
                )
                .await;
            }
            if !guard.is_lost() {
                let _ = guard.release().await;
            }
            return fail(
                EXIT_SUPERVISOR,
                format!(
                    "the supervisor of the command was killed by signal {sig}; the command's group was killed"
                ),
            );
        }
        Err(e) => {
            eprintln!("lease: waiting for the command failed: {e}");
            1
        }
    };
    if let Some((exit, _)) = stopping {
        if exit != EXIT_LOST {
            let _ = guard.release().await;
        }
        return ExitCode::from(exit);
    }
    // Lost, or past local validity with the guard not yet told (lease was frozen).
    if guard.is_lost() || tokio::time::Instant::now() >= guard.valid_until() {
        let reason = guard
            .lost_reason()
            .map_or_else(|| "local validity ran out".to_string(), |r| r.to_string());
        return fail(
            EXIT_LOST,
            format!(
                "lease on {what} was lost ({reason}) as the command finished with code {code}; its last writes may overlap another holder's"
            ),
        );
    }
    match guard {
        Held::One(guard) => end_after_min_hold(&provider, guard, acquired_at, min_hold).await,
        // Several keys take no minimum hold (refused above): give them back.
        set @ Held::Set(_) => {
            let _ = set.release().await;
        }
    }
    provider.flush(FLUSH_LIMIT).await;
    ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}

/// Which lease `lease run` takes of its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The plain lease (the default).
    Plain,
    /// A reader of the key's read/write lease (`--shared`).
    Read,
    /// The writer of the key's read/write lease (`--writer`).
    Write,
}

/// Who holds a key's read/write lease, for a refused run.
async fn rw_holders(provider: &dyn leases::LeaseProvider, key: &LeaseKey) -> String {
    match provider.inspect_rw(key).await {
        Ok(i) => match &i.writer {
            Some(w) => format!(
                "{key} is held by writer {} (token {})",
                w.holder.as_deref().unwrap_or("someone else"),
                w.token
            ),
            None => format!(
                "{key} is held by {} reader(s), {} writer(s) waiting",
                i.readers.len(),
                i.writers_waiting
            ),
        },
        Err(_) => format!("{key} is held by someone else"),
    }
}

/// Something of the command may still run: the lease is not released but
/// left to expire on the store, so the key goes to nobody else meanwhile.
async fn left_to_expire(guard: Held, message: String) -> ExitCode {
    guard.detach().await;
    fail(EXIT_SUPERVISOR, message)
}

/// SIGTERM, SIGINT and SIGHUP, registered once for the whole run.
struct Signals(
    Option<(
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
        tokio::signal::unix::Signal,
    )>,
);

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Signals(
            match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
                signal(SignalKind::hangup()),
            ) {
                (Ok(t), Ok(i), Ok(h)) => Some((t, i, h)),
                _ => None,
            },
        )
    }

    /// The next signal: its name and number.
    async fn recv(&mut self) -> (&'static str, u8) {
        match self.0.as_mut() {
            Some((term, int, hup)) => tokio::select! {
                _ = term.recv() => ("SIGTERM", 15),
                _ = int.recv() => ("SIGINT", 2),
                _ = hup.recv() => ("SIGHUP", 1),
            },
            // Without signal handling we simply never report a signal.
            None => std::future::pending().await,
        }
    }
}
