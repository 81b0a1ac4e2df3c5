//! The `lease` binary against every real store: mutual exclusion between two
//! runs, growing tokens, a paused run stopped with the lost code, a stopped
//! store, and `lease conformance`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use lease_testkit::unique;
use lease_testkit::{
    OwnedProcess, TempDir, owned_etcd, owned_postgres, owned_redis, owned_redis_with, owned_zk,
    store_url,
};

const NOT_ACQUIRED: i32 = 75;
const LOST: i32 = 79;

fn lease() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lease"));
    c.env_remove("LEASE_STORE")
        .env_remove("LEASE_CONFIG")
        .env_remove("LEASE_NAMESPACE");
    c
}

/// The shared store of a kind, as a `--store` URL.
fn shared(kind: &str) -> String {
    match kind {
        "redis" => store_url("LEASE_TEST_REDIS_URL"),
        "redlock" => format!(
            "redlock://{}",
            store_url("LEASE_TEST_REDLOCK_URLS").replace("redis://", "")
        ),
        "postgres" => store_url("LEASE_TEST_POSTGRES_URL"),
        "mysql" => store_url("LEASE_TEST_MYSQL_URL"),
        "etcd" => store_url("LEASE_TEST_ETCD_URL").replace("http://", "etcd://"),
        "zk" => format!("zk://{}", store_url("LEASE_TEST_ZK_URL")),
        other => panic!("unknown store kind {other}"),
    }
}

/// A private store of a kind that the test may stop, and its URL.
fn private(kind: &str) -> (Vec<OwnedProcess>, String) {
    match kind {
        "redis" => {
            let p = owned_redis(false);
            let url = format!("redis://127.0.0.1:{}", p.port());
            (vec![p], url)
        }
        "redlock" => {
            let ps = vec![owned_redis(false), owned_redis(false), owned_redis(false)];
            let hosts: Vec<String> = ps
                .iter()
                .map(|p| format!("127.0.0.1:{}", p.port()))
                .collect();
            let url = format!("redlock://{}", hosts.join(","));
            (ps, url)
        }
        "postgres" => {
            let p = owned_postgres();
            let url = format!("postgres://postgres@127.0.0.1:{}/postgres", p.port());
            (vec![p], url)
        }
        "mysql" => {
            let p = lease_testkit::owned_mysql(&[]);
            let url = format!("mysql://root@127.0.0.1:{}/lease", p.port());
            (vec![p], url)
        }
        "etcd" => {
            let p = owned_etcd();
            let url = format!("etcd://127.0.0.1:{}", p.port());
            (vec![p], url)
        }
        "zk" => {
            let p = owned_zk();
            let url = format!("zk://127.0.0.1:{}", p.port());
            (vec![p], url)
        }
        other => panic!("unknown store kind {other}"),
    }
}

/// A TTL the store accepts that expires quickly.
fn short_ttl(kind: &str) -> &'static str {
    if kind == "etcd" { "2s" } else { "1s" }
}

fn run_args(store: &str, key: &str, ttl: &str, extra: &[&str], cmd: &[&str]) -> Command {
    let mut c = lease();
    c.args(["--store", store, "run", "--key", key, "--ttl", ttl])
        .args(extra)
        .arg("--")
        .args(cmd);
    c
}

fn output(mut c: Command) -> Output {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run lease")
}

fn wait_for_file(path: &Path, limit: Duration) -> String {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s.trim().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {limit:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("lease did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True while `pid` runs: a zombie (exited, not yet reaped by an init that
/// may never reap it) counts as gone.
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the parenthesised command name.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

fn signal(pid: u32, sig: &str) {
    assert!(
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .unwrap()
            .success()
    );
}

fn exactly_one_of_two_runs_and_tokens_grow(kind: &str) {
    let store = shared(kind);
    let key = unique("cli-mutex");
    let dir = TempDir::new("lease-cli");
    let marker = dir.path().join("started");
    // The first run holds the key until the test lets it finish.
    let hold = format!(
        "echo $LEASE_TOKEN > {}; while [ ! -e {}.done ]; do sleep 0.05; done",
        marker.display(),
        marker.display()
    );
    // A holder label with the separator characters the stores use.
    let label = "ops: nightly #1 (ü) | a:b";
    let mut first = run_args(
        &store,
        &key,
        "30s",
        &["--holder", label],
        &["sh", "-c", &hold],
    )
    .spawn()
    .unwrap();
    let token1: u64 = wait_for_file(&marker, Duration::from_secs(20))
        .parse()
        .unwrap();
    let second = output(run_args(
        &store,
        &key,
        "30s",
        &[],
        &["sh", "-c", "echo SHOULD-NOT-RUN"],
    ));
    assert_eq!(second.status.code(), Some(NOT_ACQUIRED), "{second:?}");
    assert!(!String::from_utf8_lossy(&second.stdout).contains("SHOULD-NOT-RUN"));
    // The refused run and `status` say who holds the key.
    let refused = String::from_utf8_lossy(&second.stderr);
    assert!(
        refused.contains(&format!("held by {label} (token {token1},")),
        "{refused}"
    );
    let held = output({
        let mut c = lease();
        c.args(["--store", &store, "status", "--key", &key, "--json"]);
        c
    });
    assert_eq!(held.status.code(), Some(0), "{held:?}");
    let json: serde_json::Value = serde_json::from_slice(&held.stdout).unwrap();
    assert_eq!(json["holder"], label, "{json}");
    assert_eq!(json["token"], token1, "{json}");
    std::fs::write(format!("{}.done", marker.display()), "").unwrap();
    assert_eq!(wait_exit(&mut first, Duration::from_secs(20)), Some(0));
    // The next run gets the key (released at once) with a larger token, and
    // lease passes the command's exit code through.
    let third = output(run_args(
        &store,
        &key,
        "30s",
        &[],
        &["sh", "-c", "echo $LEASE_TOKEN; exit 7"],
    ));
    assert_eq!(third.status.code(), Some(7), "{third:?}");
    let token3: u64 = String::from_utf8_lossy(&third.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(token3 > token1, "token {token3} after {token1}");
    // Status shows a free key as free, in JSON too.
    let status = output({
        let mut c = lease();
        c.args(["--store", &store, "status", "--key", &key, "--json"]);
        c
    });
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["held"], false, "{json}");
}

fn paused_run_is_stopped_with_the_lost_code(kind: &str) {
    let store = shared(kind);
    let key = unique("cli-paused");
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut paused = run_args(
        &store,
        &key,
        short_ttl(kind),
        &["--grace", "2s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let cmd_pid = wait_for_file(&pidfile, Duration::from_secs(20));
    signal(paused.id(), "STOP");
    // Another run waits for the key and gets it once the paused one's TTL ran out.
    let other = output(run_args(
        &store,
        &key,
        "30s",
        &["--wait", "30s"],
        &["sh", "-c", "echo $LEASE_TOKEN"],
    ));
    assert_eq!(other.status.code(), Some(0), "{other:?}");
    signal(paused.id(), "CONT");
    let code = wait_exit(&mut paused, Duration::from_secs(30));
    assert_eq!(code, Some(LOST));
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(&cmd_pid) {
        assert!(
            Instant::now() < deadline,
            "the paused run's command {cmd_pid} is still running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stopped_store_stops_the_command_with_the_lost_code(kind: &str) {
    let (mut servers, store) = private(kind);
    let key = unique("cli-outage");
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    // A fresh server may need a moment before it serves (etcd elects itself).
    let mut run = run_args(
        &store,
        &key,
        short_ttl(kind),
        &["--wait", "20s", "--grace", "2s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let cmd_pid = wait_for_file(&pidfile, Duration::from_secs(30));
    // Take the store away (for Redlock: a majority of it).
    let majority = servers.len() / 2 + 1;
    for s in servers.iter_mut().take(majority) {
        s.stop();
    }
    let code = wait_exit(&mut run, Duration::from_secs(30));
    assert_eq!(code, Some(LOST));
    assert!(
        !alive(&cmd_pid),
        "the command {cmd_pid} survived the lost lease"
    );
}

/// Runs `lease conformance` in a fresh namespace, which it returns.
fn conformance_passes(store: &str) -> String {
    let namespace = unique("cli-conformance");
    let out = output({
        let mut c = lease();
        c.args(["--store", store, "--namespace", &namespace, "conformance"]);
        c
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lease conformance failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = format!("{} passed, 0 failed", lease_conformance::CASES.len());
    assert!(stdout.contains(&expected), "{stdout}");
    namespace
}

/// What the store holds under namespaces starting with `namespace`, read with
/// the store's own client, not through `lease`.
fn records_left(kind: &str, namespace: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        match kind {
            "redis" | "redlock" => {
                let urls = if kind == "redis" {
                    vec![store_url("LEASE_TEST_REDIS_URL")]
                } else {
                    store_url("LEASE_TEST_REDLOCK_URLS")
                        .split(',')
                        .map(|u| {
                            if u.starts_with("redis://") {
                                u.to_owned()
                            } else {
                                format!("redis://{u}")
                            }
                        })
                        .collect()
                };
                let mut n = Vec::new();
                for url in urls {
                    let client = ::redis::Client::open(url).unwrap();
                    let mut c = client.get_multiplexed_async_connection().await.unwrap();
                    let mut cursor = 0u64;
                    loop {
                        let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(format!("{{{namespace}*"))
                            .arg("COUNT")
                            .arg(1000)
                            .query_async(&mut c)
                            .await
                            .unwrap();
                        n.extend(keys);
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                n
            }
            "postgres" => {
                let pool = sqlx::PgPool::connect(&store_url("LEASE_TEST_POSTGRES_URL"))
                    .await
                    .unwrap();
                let rows: Vec<(String, String)> = sqlx::query_as(
                    "SELECT namespace, key FROM lease_leases WHERE left(namespace, length($1)) = $1",
                )
                .bind(namespace)
                .fetch_all(&pool)
                .await
                .unwrap();
                rows.into_iter().map(|(n, k)| format!("{n} {k}")).collect()
            }
            "mysql" => {
                let pool = sqlx::MySqlPool::connect(&store_url("LEASE_TEST_MYSQL_URL"))
                    .await
                    .unwrap();
                let rows: Vec<(Vec<u8>, Vec<u8>)> = sqlx::query_as(
                    "SELECT namespace, k FROM lease_leases WHERE LEFT(namespace, LENGTH(?)) = ?",
                )
                .bind(namespace.as_bytes())
                .bind(namespace.as_bytes())
                .fetch_all(&pool)
                .await
                .unwrap();
                rows.into_iter()
                    .map(|(n, k)| {
                        format!("{} {}", String::from_utf8_lossy(&n), String::from_utf8_lossy(&k))
                    })
                    .collect()
            }
            "etcd" => {
                let mut c = etcd_client::Client::connect([store_url("LEASE_TEST_ETCD_URL")], None)
                    .await
                    .unwrap();
                let r = c
                    .get(
                        format!("lease/{namespace}"),
                        Some(
                            etcd_client::GetOptions::new()
                                .with_prefix()
                                .with_keys_only(),
                        ),
                    )
                    .await
                    .unwrap();
                r.kvs()
                    .iter()
                    .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                    .collect()
            }
            "zk" => {
                let c = zookeeper_client::Client::connect(&store_url("LEASE_TEST_ZK_URL"))
                    .await
                    .unwrap();
                match c.list_children("/lease").await {
                    Ok(children) => children
                        .into_iter()
                        .filter(|c| c.starts_with(namespace))
                        .collect(),
                    Err(zookeeper_client::Error::NoNode) => Vec::new(),
                    Err(e) => panic!("{e}"),
                }
            }
            other => panic!("unknown store kind {other}"),
        }
    })
}

macro_rules! per_store {
    ($($kind:ident),*) => {
        $(
            mod $kind {
                #[test]
                fn exactly_one_of_two_runs_and_tokens_grow() {
                    super::exactly_one_of_two_runs_and_tokens_grow(stringify!($kind));
                }

                #[test]
                fn paused_run_is_stopped_with_the_lost_code() {
                    super::paused_run_is_stopped_with_the_lost_code(stringify!($kind));
                }

                #[test]
                fn stopped_store_stops_the_command_with_the_lost_code() {
                    super::stopped_store_stops_the_command_with_the_lost_code(stringify!($kind));
                }

                #[test]
                fn conformance_passes_and_leaves_nothing_behind() {
                    let kind = stringify!($kind);
                    let namespace = super::conformance_passes(&super::shared(kind));
                    let left = super::records_left(kind, &namespace);
                    assert!(left.is_empty(), "{kind}: records left behind: {left:?}");
                }

                #[test]
                fn kill_9_of_lease_stops_the_command_tree_within_validity() {
                    super::kill_9_of_lease_stops_the_command_tree_within_validity(stringify!($kind));
                }

                #[test]
                fn min_hold_keeps_the_key_after_the_command() {
                    super::min_hold_keeps_the_key_after_the_command(stringify!($kind));
                }
            }
        )*
    };
}

per_store!(redis, redlock, postgres, mysql, etcd, zk);

#[test]
fn conformance_passes_on_memory() {
    let _ = conformance_passes("memory://");
}

#[test]
fn terminating_lease_run_stops_the_command_and_releases_the_key() {
    let store = shared("redis");
    let key = unique("cli-sigterm");
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut run = run_args(
        &store,
        &key,
        "30s",
        &["--grace", "2s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let cmd_pid = wait_for_file(&pidfile, Duration::from_secs(20));
    signal(run.id(), "TERM");
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)), Some(143));
    assert!(!alive(&cmd_pid), "the command survived");
    // The key was released, not left to expire.
    let next = output(run_args(&store, &key, "30s", &[], &["true"]));
    assert_eq!(next.status.code(), Some(0), "{next:?}");
}

/// A password in a store URL never reaches any output: not the errors of
/// malformed, refused or unreachable URLs, not `-vv` logs, not `conformance`,
/// and not a successful run against a server that requires it.
#[test]
fn passwords_in_store_urls_are_never_printed() {
    const PW: &str = "Pw-7c1e9d2b";
    let dir = TempDir::new("lease-cli");
    let config = dir.path().join("lease.toml");
    let cases: Vec<(String, i32)> = vec![
        (format!("redis://:{PW}@127.0.0.1:1"), 69),
        (format!("redis://user:{PW}@127.0.0.1:1/0"), 69),
        (
            format!("redlock://:{PW}@127.0.0.1:1,:{PW}@127.0.0.1:2,:{PW}@127.0.0.1:3"),
            69,
        ),
        (format!("postgres://lease:{PW}@127.0.0.1:1/lease"), 69),
        (
            format!("postgres://lease@127.0.0.1:1/lease?password={PW}"),
            69,
        ),
        // Refused before connecting: each message names the problem, not the secret.
        (format!("redis://:{PW}@127.0.0.1:99999"), 64),
        (
            format!("redlock://:{PW}@127.0.0.1:1,:{PW}@127.0.0.1:1,:{PW}@127.0.0.1:3"),
            64,
        ),
        (
            format!("postgres://lease:{PW}@127.0.0.1:1/lease?lease_tabel=x"),
            64,
        ),
        (format!("etcd://root:{PW}@127.0.0.1:1"), 69),
        (
            format!("etcds://root:{PW}@127.0.0.1:1?ca=/nonexistent.pem"),
            64,
        ),
        (format!("zk://digest:{PW}@127.0.0.1:1"), 69),
        (format!("redis:/:{PW}@127.0.0.1:1"), 64),
    ];
    for (url, code) in &cases {
        std::fs::write(&config, format!("store = {url:?}\n")).unwrap();
        let runs: [Vec<&str>; 5] = [
            vec!["--store", url, "-vv", "status", "--key", "k"],
            vec!["--store", url, "-vv", "run", "--key", "k", "--", "true"],
            vec!["--store", url, "-vv", "acquire", "--key", "k"],
            vec!["--store", url, "-vv", "conformance"],
            vec![
                "--config",
                config.to_str().unwrap(),
                "-vv",
                "status",
                "--key",
                "k",
            ],
        ];
        for args in runs {
            let out = output({
                let mut c = lease();
                c.args(&args);
                c
            });
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!text.contains(PW), "{args:?} printed the password:\n{text}");
            // `acquire` is refused (64) on ZooKeeper whatever the URL says.
            let zk_acquire = url.starts_with("zk://") && args.contains(&"acquire");
            let expected = if zk_acquire { 64 } else { *code };
            assert_eq!(out.status.code(), Some(expected), "{args:?}:\n{text}");
        }
    }
    // A server that requires the password: the run succeeds and logs say nothing of it.
    let server = owned_redis_with(false, &["--requirepass", PW]);
    let url = format!("redis://:{PW}@127.0.0.1:{}", server.port());
    let out = output({
        let mut c = lease();
        c.args(["--store", &url, "-vv", "run", "--key", "k", "--", "true"]);
        c
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains(PW), "{text}");
    // -vv shows each store call in its `lease.store` span, with its outcome.
    for part in [
        "lease.store",
        "\"redis\"",
        "\"acquire\"",
        "\"acquired\"",
        "\"release\"",
    ] {
        assert!(text.contains(part), "no {part} in:\n{text}");
    }
    // A wrong password is access denied (78), not "unavailable".
    let wrong = format!("redis://:not-{PW}@127.0.0.1:{}", server.port());
    let out = output({
        let mut c = lease();
        c.args(["--store", &wrong, "run", "--key", "k", "--", "true"]);
        c
    });
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{text}");
    assert!(!text.contains(PW) && text.contains("denied"), "{text}");
}

#[test]
fn usage_errors_have_their_own_code() {
    // (No store at all is not an error: the default SQLite store is used,
    // see `with_no_store_runs_coordinate_across_processes`.)
    for args in [
        vec!["--store", "nope://x", "status", "--key", "k"],
        vec![
            "--store",
            "redis://127.0.0.1:1",
            "run",
            "--key",
            "k",
            "--ttl",
            "soon",
            "--",
            "true",
        ],
        vec!["--store", "memory://", "frobnicate"],
        vec![
            "--store",
            "redis://127.0.0.1:1",
            "--holder",
            "",
            "status",
            "--key",
            "k",
        ],
        vec![
            "--store",
            "redis://127.0.0.1:1",
            "--holder",
            "a\nb",
            "status",
            "--key",
            "k",
        ],
    ] {
        let out = output({
            let mut c = lease();
            c.args(&args);
            c
        });
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?} printed no reason");
    }
    let out = output({
        let mut c = lease();
        c.args(["--store", "redis://127.0.0.1:1", "status", "--key", "k"]);
        c
    });
    assert_eq!(out.status.code(), Some(69), "{out:?}");
}

#[test]
fn config_file_and_environment_choose_the_store() {
    let dir = TempDir::new("lease-cli");
    let file: PathBuf = dir.path().join("lease.toml");
    std::fs::write(
        &file,
        format!(
            "store = \"{}\"\nnamespace = \"from-file\"\ndefault_ttl = \"5s\"\n",
            shared("redis")
        ),
    )
    .unwrap();
    let key = unique("cli-config");
    let out = output({
        let mut c = lease();
        c.args([
            "--config",
            file.to_str().unwrap(),
            "run",
            "--key",
            &key,
            "--",
            "sh",
            "-c",
            "echo $LEASE_KEY",
        ]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), key);
    let out = output({
        let mut c = lease();
        c.env("LEASE_STORE", shared("redis"))
            .env("LEASE_NAMESPACE", "from-file")
            .args(["status", "--key", &key]);
        c
    });
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{key}: free")
    );
    assert_eq!(out.status.code(), Some(3), "status of a free key: {out:?}");
}

#[test]
fn memory_is_refused_for_commands_that_coordinate_processes() {
    for args in [
        vec!["--store", "memory://", "run", "--key", "k", "--", "true"],
        vec!["--store", "memory://", "status", "--key", "k"],
    ] {
        let out = output({
            let mut c = lease();
            c.args(&args);
            c
        });
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("one process"),
            "{out:?}"
        );
    }
}

#[test]
fn bad_commands_flags_and_variables_are_refused_before_any_lease() {
    let store = shared("redis");
    let key = unique("cli-refused");
    let cases: [(&[&str], &[&str], i32); 3] = [
        (&["--frob"], &["echo", "x"], 64),
        (&[], &["no-such-command-for-lease-tests"], 127),
        (&[], &["/etc/hostname"], 126),
    ];
    for (extra, cmd, code) in cases {
        let out = output(run_args(&store, &key, "30s", extra, cmd));
        assert_eq!(out.status.code(), Some(code), "{extra:?} {cmd:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{cmd:?} printed no reason");
    }
    let out = output({
        let mut c = run_args(&store, &key, "30s", &[], &["true"]);
        c.env("LEASE_DEFAULT_TTL", "soon");
        c
    });
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("LEASE_DEFAULT_TTL"),
        "{out:?}"
    );
    // No lease was taken by any of them: the key is free, never acquired.
    let status = output({
        let mut c = lease();
        c.args(["--store", &store, "status", "--key", &key]);
        c
    });
    assert_eq!(status.status.code(), Some(3), "{status:?}");
}

#[test]
fn huge_durations_and_waiting_forever_never_panic() {
    let store = shared("redis");
    let key = unique("cli-huge");
    let out = output(run_args(
        &store,
        &key,
        "30s",
        &["--wait", "forever"],
        &["true"],
    ));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = output(run_args(
        &store,
        &key,
        "30s",
        &["--wait", "18446744073709551615s"],
        &["true"],
    ));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = output(run_args(&store, &key, "1000000d", &[], &["true"]));
    assert_eq!(
        out.status.code(),
        Some(64),
        "a TTL beyond the store's maximum: {out:?}"
    );
    let out = output(run_args(
        &store,
        &key,
        "30s",
        &["--min-hold", "18446744073709551615s"],
        &["true"],
    ));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{out:?}"
    );
}

#[test]
fn sighup_stops_the_command_and_releases_the_key() {
    let store = shared("redis");
    let key = unique("cli-sighup");
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut run = run_args(
        &store,
        &key,
        "30s",
        &["--grace", "2s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let cmd_pid = wait_for_file(&pidfile, Duration::from_secs(20));
    signal(run.id(), "HUP");
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)), Some(129));
    assert!(!alive(&cmd_pid), "the command survived SIGHUP");
    let next = output(run_args(&store, &key, "30s", &[], &["true"]));
    assert_eq!(next.status.code(), Some(0), "released at once: {next:?}");
}

/// `kill -9` of `lease run`: no process of the command's tree (a shell and
/// the background job it started) may outlive the lease's local validity.
fn kill_9_of_lease_stops_the_command_tree_within_validity(kind: &str) {
    let store = shared(kind);
    let key = unique("cli-kill9");
    let dir = TempDir::new("lease-cli");
    let pids = dir.path().join("pids");
    let script = format!("sleep 100 & echo \"$$ $!\" > {}; wait", pids.display());
    let ttl = short_ttl(kind);
    let mut run = run_args(
        &store,
        &key,
        ttl,
        &["--grace", "30s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let line = wait_for_file(&pids, Duration::from_secs(20));
    let tree: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(tree.len(), 2, "{line}");
    signal(run.id(), "KILL");
    let killed = Instant::now();
    let _ = run.wait();
    let ttl: Duration = match ttl {
        "2s" => Duration::from_secs(2),
        _ => Duration::from_secs(1),
    };
    while tree.iter().any(|p| alive(p)) {
        assert!(
            killed.elapsed() < ttl,
            "processes {tree:?} of the command outlived the lease's TTL {ttl:?} after kill -9"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!(
        "{kind}: the command tree was gone {:?} after kill -9 of lease",
        killed.elapsed()
    );
}

/// Processes that leave the command's process group (`setsid`) or are
/// orphaned by a double fork are stopped with the command: when it exits, and
/// when `lease` is killed with -9.
#[test]
fn processes_that_leave_the_group_do_not_outlive_the_command() {
    let store = shared("redis");
    let dir = TempDir::new("lease-cli");
    // One child in a new session, one orphaned by a double fork (its parent
    // subshell exits at once), both recorded, then the command goes on.
    let escape = |tag: &str, then: &str| {
        let a = dir.path().join(format!("{tag}-a"));
        let b = dir.path().join(format!("{tag}-b"));
        let script = format!(
            "setsid sleep 100 & echo $! > {a}.tmp; mv {a}.tmp {a}; \
             (setsid sleep 100 & echo $! > {b}.tmp; mv {b}.tmp {b}) & \
             while [ ! -e {b} ]; do sleep 0.01; done; {then}",
            a = a.display(),
            b = b.display()
        );
        (script, a, b)
    };
    let gone = |pids: &[String], within: Duration, what: &str| {
        let start = Instant::now();
        while pids.iter().any(|p| alive(p)) {
            assert!(
                start.elapsed() < within,
                "{what}: {pids:?} still running after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // 1. The command exits: what it left anywhere in its tree goes with it.
    let (script, a, b) = escape("exit", "exit 0");
    let out = output(run_args(
        &store,
        &unique("cli-escape"),
        "30s",
        &[],
        &["sh", "-c", &script],
    ));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let pids = [
        std::fs::read_to_string(&a).unwrap(),
        std::fs::read_to_string(&b).unwrap(),
    ]
    .map(|p| p.trim().to_owned());
    gone(&pids, Duration::from_secs(2), "after the command exited");

    // 2. kill -9 of `lease` while the command runs.
    let (script, a, b) = escape("kill9", "wait");
    let mut run = run_args(
        &store,
        &unique("cli-escape"),
        "1s",
        &["--grace", "30s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    wait_for_file(&b, Duration::from_secs(20));
    let pids = [
        std::fs::read_to_string(&a).unwrap(),
        std::fs::read_to_string(&b).unwrap(),
    ]
    .map(|p| p.trim().to_owned());
    assert!(pids.iter().all(|p| alive(p)), "{pids:?}");
    signal(run.id(), "KILL");
    let _ = run.wait();
    gone(
        &pids,
        Duration::from_secs(1),
        "after kill -9 of lease (TTL 1 s)",
    );
}

/// `--min-hold` holds on every store, also where leases end with the session
/// (ZooKeeper): a second run right after the first one finished is refused.
fn min_hold_keeps_the_key_after_the_command(kind: &str) {
    let store = shared(kind);
    let key = unique("cli-min-hold");
    let dir = TempDir::new("lease-cli");
    let marker = dir.path().join("ran");
    let script = format!("echo ran > {}", marker.display());
    let started = Instant::now();
    // Where leases end with the session, `lease` stays (renewing) for the hold,
    // so run it in the background and look while the hold lasts.
    let mut first = run_args(
        &store,
        &key,
        "30s",
        &["--min-hold", "6s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    wait_for_file(&marker, Duration::from_secs(20));
    // Let a plain run finish and its process (and session) go away first.
    std::thread::sleep(Duration::from_millis(500));
    let second = output(run_args(&store, &key, "30s", &[], &["true"]));
    let checked_at = started.elapsed();
    assert!(
        checked_at < Duration::from_secs(5),
        "too slow to check the hold: {checked_at:?}"
    );
    assert_eq!(
        second.status.code(),
        Some(NOT_ACQUIRED),
        "{kind}: a run {checked_at:?} into a 6 s minimum hold got the key: {second:?}"
    );
    assert_eq!(wait_exit(&mut first, Duration::from_secs(30)), Some(0));
}

#[test]
fn conformance_fails_fast_on_an_unreachable_store_and_reports_json() {
    let started = Instant::now();
    let out = output({
        let mut c = lease();
        c.args(["--store", "redis://127.0.0.1:1", "conformance"]);
        c
    });
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let out = output({
        let mut c = lease();
        c.args([
            "--store",
            "memory://",
            "--namespace",
            "mine",
            "conformance",
            "--json",
        ]);
        c
    });
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["namespace"], "mine", "{json}");
    assert_eq!(json["capabilities"]["backend"], "memory", "{json}");
    assert_eq!(json["passed"], lease_conformance::CASES.len(), "{json}");
    assert_eq!(json["failed"], 0, "{json}");
}

/// The supervisor is killed outright (SIGKILL): `lease` kills the command's
/// group itself before it gives the lease up, and says so (exit 70).
#[test]
fn a_killed_supervisor_takes_the_command_with_it() {
    kill_the_supervisor("cli-supervisor-killed", false);
}

/// The supervisor is killed before `lease` learned the command's group
/// (`lease` is frozen from the moment the supervisor appears until after the
/// kill): the command is re-parented to `lease`, a child subreaper, which
/// still kills it before giving the lease up.
#[test]
fn a_supervisor_killed_before_the_holder_saw_the_command_still_takes_it() {
    kill_the_supervisor("cli-supervisor-killed-early", true);
}

/// Runs a sleeping command under `lease run`, SIGKILLs the supervisor, and
/// asserts that `lease` exits 70, the command is gone and the key is free.
/// With `freeze_holder`, `lease` is stopped from the moment its supervisor
/// appears until after the kill.
fn kill_the_supervisor(name: &str, freeze_holder: bool) {
    let store = shared("redis");
    let key = unique(name);
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut run = run_args(&store, &key, "30s", &[], &["sh", "-c", &script])
        .spawn()
        .unwrap();
    let children = format!("/proc/{0}/task/{0}/children", run.id());
    let started = Instant::now();
    let supervisor: u32 = loop {
        let listed = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = listed.split_whitespace().next() {
            break pid.parse().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no supervisor started"
        );
        std::thread::yield_now();
    };
    if freeze_holder {
        // In-process, so the holder stops before the supervisor has even
        // started the command (a `kill` process would take milliseconds).
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(run.id()).unwrap()),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
    }
    let cmd_pid = wait_for_file(&pidfile, Duration::from_secs(20));
    signal(supervisor, "KILL");
    if freeze_holder {
        signal(run.id(), "CONT");
    }
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)), Some(70));
    assert!(!alive(&cmd_pid), "the command outlived its supervisor");
    let next = output(run_args(&store, &key, "30s", &[], &["true"]));
    assert_eq!(next.status.code(), Some(0), "released: {next:?}");
}

/// A frozen `lease` (SIGSTOP) stops renewing; the supervisor kills a command
/// that ignores SIGTERM by the lease's local validity, however long --grace is.
#[test]
fn a_frozen_holder_cannot_keep_a_command_past_validity() {
    let store = shared("redis");
    let key = unique("cli-frozen-holder");
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        pidfile.display()
    );
    let mut run = run_args(
        &store,
        &key,
        "1s",
        &["--grace", "60s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let cmd_pid = wait_for_file(&pidfile, Duration::from_secs(20));
    signal(run.id(), "STOP");
    let frozen = Instant::now();
    // By the lease's validity (at most 1 s after the freeze), not the 60 s
    // grace; 500 ms more for a loaded machine to wake the supervisor, kill
    // and reap (the freeze may land just after a renewal was passed on).
    while alive(&cmd_pid) {
        assert!(
            frozen.elapsed() < Duration::from_millis(1500),
            "the command ran {:?} past the freeze of a 1 s lease",
            frozen.elapsed()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(run.id(), "CONT");
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)), Some(LOST));
}

/// The lease is lost (the store stops) while the command ignores SIGTERM and
/// --grace is long: SIGKILL comes at local validity, not after the grace.
#[test]
fn a_lost_lease_kills_a_stubborn_command_by_validity_not_grace() {
    let (mut servers, store) = private("redis");
    let key = unique("cli-stubborn");
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
        pidfile.display()
    );
    let mut run = run_args(
        &store,
        &key,
        "1s",
        &["--wait", "20s", "--grace", "60s"],
        &["sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let cmd_pid = wait_for_file(&pidfile, Duration::from_secs(30));
    servers[0].stop();
    let stopped = Instant::now();
    assert_eq!(wait_exit(&mut run, Duration::from_secs(20)), Some(LOST));
    assert!(
        stopped.elapsed() < Duration::from_secs(3),
        "lease exited {:?} after the store stopped (TTL 1 s, grace 60 s)",
        stopped.elapsed()
    );
    assert!(!alive(&cmd_pid), "the stubborn command survived");
}

/// `acquire`, `check`, `extend` and `release` hand a lease between separate
/// commands of a script through its LEASE_* variables.
#[test]
fn scripts_acquire_check_extend_and_release_a_lease() {
    for kind in ["redis", "etcd", "postgres"] {
        script_round(kind);
    }
    // Leases that end with the process's session cannot be handed on.
    let zk = output({
        let mut c = lease();
        c.args(["--store", &shared("zk"), "acquire", "--key", "k"]);
        c
    });
    assert_eq!(zk.status.code(), Some(64), "{zk:?}");
    assert!(
        String::from_utf8_lossy(&zk.stderr).contains("session"),
        "{zk:?}"
    );
}

fn script_round(kind: &str) {
    let store = shared(kind);
    let key = unique("cli-script");
    let cli = |args: &[&str], env: &[(String, String)]| {
        output({
            let mut c = lease();
            c.args(["--store", &store]).args(args);
            for (k, v) in env {
                c.env(k, v);
            }
            c
        })
    };
    let out = cli(&["acquire", "--key", &key, "--ttl", "30s"], &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let env: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').to_owned()))
        .collect();
    let token = env
        .iter()
        .find(|(k, _)| k == "LEASE_TOKEN")
        .unwrap()
        .1
        .clone();
    assert_eq!(
        env.iter().find(|(k, _)| k == "LEASE_KEY").unwrap().1,
        key,
        "{kind}"
    );
    let label = &env.iter().find(|(k, _)| k == "LEASE_HOLDER").unwrap().1;
    assert!(
        label.contains('@') && label.contains(':'),
        "{kind}: holder {label}"
    );
    // The backend's handle goes through the variables typed, not as a number.
    let handle = &env.iter().find(|(k, _)| k == "LEASE_HANDLE").unwrap().1;
    let expected = if kind == "etcd" { "etcd:" } else { "none" };
    assert!(handle.starts_with(expected), "{kind}: handle {handle}");
    let shown = cli(&["status", "--key", &key, "--json"], &[]);
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(json["holder"], label.as_str(), "{kind}: {json}");
    let again = cli(&["acquire", "--key", &key], &[]);
    assert_eq!(again.status.code(), Some(NOT_ACQUIRED), "{again:?}");
    assert_eq!(cli(&["check"], &env).status.code(), Some(0));
    let wrong = (token.parse::<u64>().unwrap() + 1).to_string();
    assert_eq!(
        cli(&["check", "--key", &key, "--token", &wrong], &[])
            .status
            .code(),
        Some(LOST)
    );
    let extended = cli(&["extend", "--ttl", "60s"], &env);
    assert_eq!(extended.status.code(), Some(0), "{extended:?}");
    assert_eq!(cli(&["release"], &env).status.code(), Some(0));
    assert_eq!(
        cli(&["release"], &env).status.code(),
        Some(LOST),
        "double release"
    );
    assert_eq!(
        cli(&["check"], &env).status.code(),
        Some(LOST),
        "free after release"
    );
}

#[test]
fn completions_and_version_are_printed() {
    for args in [&["completions", "bash"][..], &["--version"][..]] {
        let out = output({
            let mut c = lease();
            c.args(args);
            c
        });
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
}

/// With no store given, `lease run` uses the per-user SQLite database and
/// coordinates separate processes: 8 concurrent runs of 5 read-increment-write
/// rounds each end exact, with growing tokens.
#[test]
fn with_no_store_runs_coordinate_across_processes() {
    let dir = TempDir::new("lease-cli-default");
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0").unwrap();
    let ns = unique("default-store");
    let script = format!(
        "n=$(cat {c}); sleep 0.01; echo $((n+1)) > {c}; echo $LEASE_TOKEN >> {c}.tokens",
        c = counter.display()
    );
    // Each round is its own `lease run` (as root the database is in
    // /var/lib/lease; the namespace keeps this run apart).
    let rounds: Vec<Child> = (0..8)
        .map(|_| {
            let script = script.clone();
            let ns = ns.clone();
            let xdg = dir.path().to_path_buf();
            let bin = env!("CARGO_BIN_EXE_lease");
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "for i in 1 2 3 4 5; do XDG_STATE_HOME={xdg} {bin} --namespace {ns} run --key counter --wait 60s -- sh -c '{script}' || exit 1; done",
                    xdg = xdg.display()
                ))
                .env_remove("LEASE_STORE")
                .env_remove("LEASE_CONFIG")
                .env_remove("LEASE_NAMESPACE")
                .spawn()
                .unwrap()
        })
        .collect();
    for mut r in rounds {
        assert!(r.wait().unwrap().success(), "a round failed");
    }
    assert_eq!(std::fs::read_to_string(&counter).unwrap().trim(), "40");
    let tokens: Vec<u64> = std::fs::read_to_string(format!("{}.tokens", counter.display()))
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 40);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens grow: {tokens:?}"
    );
    // `-v` says which store it used.
    let out = lease()
        .env("XDG_STATE_HOME", dir.path())
        .args([
            "-v",
            "--namespace",
            &ns,
            "run",
            "--key",
            "other",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sqlite://"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `lease chaos` against a user's store: real worker processes (this binary
/// again), pauses and kill -9 aimed at the holder, judged by the checker.
#[test]
fn chaos_runs_workers_against_the_store_and_judges_them() {
    let out = output({
        let mut c = lease();
        c.args([
            "--store",
            &shared("redis"),
            "--namespace",
            &unique("cli-chaos"),
            "chaos",
            "--faults",
            "pause,crash",
            "--fault-every",
            "1s",
            "--duration",
            "10s",
        ]);
        c
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lease chaos failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("PASS"), "{stdout}");
    assert!(
        stdout.contains("\"crash\"") && stdout.contains("\"pause\""),
        "both faults were injected: {stdout}"
    );
    // A cell that cannot run is a usage error, not a verdict.
    let out = output({
        let mut c = lease();
        c.args(["--store", "memory://", "chaos"]);
        c
    });
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory://"));
}

/// `--once-per`: of six runs racing for one slot, one runs the command and
/// the rest exit 75, whenever they come; the next slot runs again; a kept
/// claim ends after --keep-claim.
#[test]
fn once_per_slot_runs_the_command_once() {
    let store = shared("postgres");
    once_per_slot(&store);
    // Other stores have no slot claims; --keep-claim alone is a usage error.
    let key = unique("cli-once");
    let redis = output(run_args(
        &shared("redis"),
        &key,
        "10s",
        &["--once-per", "x"],
        &["true"],
    ));
    assert_eq!(redis.status.code(), Some(64), "{redis:?}");
    assert!(String::from_utf8_lossy(&redis.stderr).contains("PostgreSQL or MySQL"));
    let alone = output(run_args(
        &store,
        &key,
        "10s",
        &["--keep-claim", "1s"],
        &["true"],
    ));
    assert_eq!(alone.status.code(), Some(64), "{alone:?}");
}

/// The same on MySQL/MariaDB (`lease_mysql::OnceClaims`).
#[test]
fn once_per_slot_runs_the_command_once_on_mysql() {
    once_per_slot(&shared("mysql"));
}

fn once_per_slot(store: &str) {
    let store = store.to_owned();
    let key = unique("cli-once");
    let dir = TempDir::new("lease-cli");
    let log = dir.path().join("runs");
    let script = format!("echo ran >> {}", log.display());
    let once = |slot: &str, extra: &[&str]| {
        let mut args = vec!["--once-per", slot, "--wait", "30s"];
        args.extend_from_slice(extra);
        run_args(&store, &key, "10s", &args, &["sh", "-c", &script])
    };
    let racers: Vec<Child> = (0..6)
        .map(|_| {
            let mut c = once("2026-12-04T02:00", &[]);
            c.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut codes = Vec::new();
    for child in racers {
        let out = child.wait_with_output().unwrap();
        let code = out.status.code();
        if code == Some(NOT_ACQUIRED) {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("claimed already"), "{err}");
        }
        codes.push(code);
    }
    let ran = |n: usize| {
        let runs = std::fs::read_to_string(&log).unwrap_or_default();
        assert_eq!(runs.lines().count(), n, "{codes:?}");
    };
    ran(1);
    assert_eq!(
        codes.iter().filter(|c| **c == Some(0)).count(),
        1,
        "{codes:?}"
    );
    assert_eq!(
        codes.iter().filter(|c| **c == Some(NOT_ACQUIRED)).count(),
        5,
        "{codes:?}"
    );
    // Later, the same slot still does not run; the next one does.
    assert_eq!(
        output(once("2026-12-04T02:00", &[])).status.code(),
        Some(NOT_ACQUIRED)
    );
    assert_eq!(output(once("2026-12-05T02:00", &[])).status.code(), Some(0));
    ran(2);
    // A claim kept for a while: the slot runs again after it. (5 s: the
    // second run, a new process with a new connection, must see the claim
    // within it on a loaded machine; the claim was made before the first
    // run ended, so it is gone 5 s after that.)
    assert_eq!(
        output(once("hourly", &["--keep-claim", "5s"]))
            .status
            .code(),
        Some(0)
    );
    let first_ended = std::time::Instant::now();
    assert_eq!(
        output(once("hourly", &["--keep-claim", "5s"]))
            .status
            .code(),
        Some(NOT_ACQUIRED)
    );
    std::thread::sleep(Duration::from_millis(5200).saturating_sub(first_ended.elapsed()));
    assert_eq!(
        output(once("hourly", &["--keep-claim", "5s"]))
            .status
            .code(),
        Some(0)
    );
    ran(4);
}

/// PostgreSQL's advisory mode: when `lease run` is killed (kill -9), its
/// database session ends and the key is free at once, not after the 60 s
/// TTL; the supervisor kills the command as soon as `lease` is gone, so the
/// next run's command never overlaps it.
#[test]
fn advisory_lease_of_a_killed_run_is_free_at_once_and_its_command_is_gone() {
    advisory_killed_run(&format!("{}?lease_mode=advisory", shared("postgres")));
}

/// The same on MySQL/MariaDB's advisory mode (`GET_LOCK` on the run's session).
#[test]
fn mysql_advisory_lease_of_a_killed_run_is_free_at_once_and_its_command_is_gone() {
    advisory_killed_run(&format!("{}?lease_mode=advisory", shared("mysql")));
}

/// `lease conformance` passes on MySQL/MariaDB's advisory mode.
#[test]
fn conformance_passes_on_mysql_advisory() {
    let _ = conformance_passes(&format!("{}?lease_mode=advisory", shared("mysql")));
}

fn advisory_killed_run(store: &str) {
    let store = store.to_owned();
    let key = unique("cli-advisory");
    let dir = TempDir::new("lease-cli");
    let pidfile = dir.path().join("pid");
    // The command ignores SIGTERM: only a SIGKILL stops it in time.
    let script = format!(
        "trap '' TERM; echo $$ > {}; exec sleep 60",
        pidfile.display()
    );
    let mut first = run_args(&store, &key, "60s", &[], &["sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let command_pid = wait_for_file(&pidfile, Duration::from_secs(20));
    let command_pid = command_pid.trim().to_owned();
    assert!(alive(&command_pid));
    let held = output({
        let mut c = lease();
        c.args(["--store", &store, "status", "--key", &key]);
        c
    });
    assert_eq!(held.status.code(), Some(0), "{held:?}");
    let killed = Instant::now();
    signal(first.id(), "KILL");
    let _ = first.wait();
    let second = output(run_args(
        &store,
        &key,
        "60s",
        &["--wait", "10s"],
        &["sh", "-c", "true"],
    ));
    let after = killed.elapsed();
    assert_eq!(second.status.code(), Some(0), "{second:?}");
    assert!(
        after < Duration::from_secs(8),
        "the next run got the key {after:?} after kill -9 (TTL 60 s)"
    );
    assert!(!alive(&command_pid), "the killed run's command still runs");
}

/// Writes `go` when dropped: the fair tests' holder command ends with the
/// test, whatever happens in it.
struct Go(PathBuf);

impl Drop for Go {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, b"");
    }
}

/// A `lease run` on Redis holding `key` until the returned guard writes its
/// `go` file (or is dropped).
fn fair_holder(store: &str, key: &str, dir: &TempDir) -> (Child, Go) {
    let go = dir.path().join("go");
    let hold = format!(
        "echo held > {}; while [ ! -f {} ]; do sleep 0.05; done",
        dir.path().join("holding").display(),
        go.display()
    );
    let holder = run_args(store, key, "30s", &[], &["sh", "-c", &hold])
        .spawn()
        .expect("start the holder");
    let go = Go(go);
    wait_for_file(&dir.path().join("holding"), Duration::from_secs(30));
    (holder, go)
}

/// Waits until `key`'s queue of fair waiters on Redis holds `n` tickets.
fn await_queued(key: &str, n: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = ::redis::Client::open(store_url("LEASE_TEST_REDIS_URL")).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let waiting: usize = ::redis::cmd("ZCARD")
                .arg(format!("{{lease|{key}}}:queue"))
                .query_async(&mut c)
                .await
                .unwrap();
            if waiting >= n {
                return;
            }
            assert!(Instant::now() < until, "run {n} never joined the queue");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

fn fair_run(store: &str, key: &str, line: &str, order: &Path) -> Child {
    let append = format!("echo {line} >> {}", order.display());
    run_args(
        store,
        key,
        "30s",
        &["--fair", "--wait", "60s"],
        &["sh", "-c", &append],
    )
    .spawn()
    .expect("start a fair run")
}

/// Fair runs (`--fair`) queued behind a holder on Redis run their commands
/// in the order they arrived; each is seen in the store's queue before the
/// next one starts.
#[test]
fn fair_runs_go_in_arrival_order() {
    const RUNS: usize = 4;
    let store = shared("redis");
    let key = unique("cli-fair");
    let dir = TempDir::new("lease-cli");
    let order = dir.path().join("order");
    let (mut holder, go) = fair_holder(&store, &key, &dir);
    let mut runs = Vec::new();
    for i in 0..RUNS {
        runs.push(fair_run(&store, &key, &i.to_string(), &order));
        await_queued(&key, i + 1);
    }
    drop(go);
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(30)), Some(0));
    for (i, r) in runs.iter_mut().enumerate() {
        assert_eq!(wait_exit(r, Duration::from_secs(60)), Some(0), "run {i}");
    }
    let got = std::fs::read_to_string(&order).unwrap();
    let want: String = (0..RUNS).map(|i| format!("{i}\n")).collect();
    assert_eq!(got, want, "fair runs went in another order");
}

/// A fair run killed with SIGKILL while it waits in line leaves a ticket
/// nobody refreshes: the run behind it gets the key once that ticket's TTL
/// (at most `MAX_TICKET_TTL`) ran out, not at the end of its own wait.
#[test]
fn kill_9_of_a_fair_waiter_frees_its_place_within_the_ticket_ttl() {
    let store = shared("redis");
    let key = unique("cli-fair-kill");
    let dir = TempDir::new("lease-cli");
    let order = dir.path().join("order");
    let (mut holder, go) = fair_holder(&store, &key, &dir);
    let mut killed = fair_run(&store, &key, "killed", &order);
    await_queued(&key, 1);
    let mut behind = fair_run(&store, &key, "behind", &order);
    await_queued(&key, 2);
    signal(killed.id(), "KILL");
    let _ = killed.wait();
    drop(go);
    let released = Instant::now();
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(30)), Some(0));
    let bound = leases::backend::MAX_TICKET_TTL + Duration::from_secs(10);
    assert_eq!(
        wait_exit(&mut behind, bound),
        Some(0),
        "the run behind a killed fair waiter did not run within {bound:?}"
    );
    assert!(released.elapsed() < bound, "{:?}", released.elapsed());
    assert_eq!(std::fs::read_to_string(&order).unwrap(), "behind\n");
}

/// A store without a queue of waiters refuses `--fair` with the usage code
/// and says why.
#[test]
fn fair_run_on_a_store_without_a_queue_is_refused() {
    let dir = TempDir::new("lease-cli");
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    let out = output(run_args(&store, "k", "30s", &["--fair"], &["true"]));
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fair waiting"), "{err}");
}
