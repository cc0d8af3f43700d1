//! Password authentication on the real binary: a role the server asks for its password
//! (`scram-sha-256`), the password given in the URL, in `HERALD_STORE_PASSWORD`, or in
//! `PGPASSWORD`; a wrong one ends start-up in one line. The password is never in herald's
//! output, at `debug` level included.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::herald::{write_config, Proc};
use common::http;
use common::pg::PgServer;

const PASSWORD: &str = "Pw-0f-h3rald";

/// Starts the binary with `env`, its log (debug) in a file; answers the process and the file.
fn spawn(dir: &std::path::Path, name: &str, env: &[(&str, &str)]) -> (Proc, std::path::PathBuf) {
    let config = write_config(dir, "");
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Proc::command(&config, &dir.join(name));
    cmd.env_remove("HERALD_STORE_URL")
        .env_remove("PGPASSWORD")
        .env_remove("HERALD_STORE_PASSWORD")
        .env("HERALD_LOG", "debug")
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    for (k, v) in env {
        cmd.env(k, v);
    }
    (Proc::start(cmd), log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_from_the_url_or_the_environment_works_and_is_never_logged() {
    // A server of its own: the test changes its pg_hba.conf.
    let Some(pg) = PgServer::start("a_password_from_the_url_or_the_environment") else {
        return;
    };
    let url = pg.password_role("herald_pw", PASSWORD);
    let with_pw = url.replacen("herald_pw@", &format!("herald_pw:{PASSWORD}@"), 1);
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<(&str, &str)>); 3] = [
        ("url", vec![("HERALD_STORE_URL", with_pw.as_str())]),
        (
            "herald_env",
            vec![
                ("HERALD_STORE_URL", url.as_str()),
                ("HERALD_STORE_PASSWORD", PASSWORD),
            ],
        ),
        (
            "pg_env",
            vec![("HERALD_STORE_URL", url.as_str()), ("PGPASSWORD", PASSWORD)],
        ),
    ];
    for (name, env) in &cases {
        let (mut p, log) = spawn(dir.path(), name, env);
        let r = http::post_json(
            &format!("{}/v1/tasks", p.url),
            &serde_json::json!({"id": *name, "schedule": {"after": "1h"},
                                "messages": [{"to": "a", "body": "x"}]}),
        )
        .await;
        assert_eq!(r.status, 201, "{name}: {}", r.text());
        let h = http::get(&format!("{}/healthz", p.url)).await;
        assert_eq!(h.status, 200, "{name}: {}", h.text());
        p.signal(libc::SIGTERM);
        assert_eq!(
            p.wait_exit(Duration::from_secs(20)).await,
            Some(0),
            "{name}"
        );
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.is_empty(), "{name}: herald logged nothing at debug");
        assert!(
            !text.contains(PASSWORD),
            "{name}: the password is in the log:\n{text}"
        );
    }
    // The three starts wrote to the one database, as the role.
    assert_eq!(
        pg.psql(
            &url.replace("herald_pw@", "postgres@"),
            "SELECT count(*) FROM herald_specs"
        ),
        "3"
    );

    // A wrong password: one line naming the URL without any password, non-zero exit.
    let wrong = url.replacen("herald_pw@", "herald_pw:not-it@", 1);
    let config = write_config(dir.path(), "");
    let out = Proc::command(&config, &dir.path().join("wrong"))
        .env("HERALD_STORE_URL", &wrong)
        .env("PGPASSWORD", PASSWORD)
        .env("HERALD_LOG", "debug")
        .stderr(Stdio::piped())
        .output()
        .expect("run herald");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("password authentication failed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("herald_pw:***@"),
        "names the store: {stderr}"
    );
    assert!(
        !stderr.contains("not-it") && !stderr.contains(PASSWORD),
        "{stderr}"
    );
}
