//! A private PostgreSQL server for tests (HA.md "Tests"): `initdb` and `pg_ctl` from the newest
//! `/usr/lib/postgresql/*/bin`, a temp dir, a free loopback port, `fsync` left on (durability is
//! what the tests are about), run as the `postgres` user when the test runs as root (`initdb`
//! refuses root), stopped with `pg_ctl stop -m fast` when the last holder drops it.
//!
//! One server per test binary: [`PgServer::shared`] hands every test of the binary the same
//! server while any of them holds it; each test takes a fresh database ([`PgServer::create_db`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::tools;

pub const INSTALL: &str = "apt-get install -y postgresql";

pub struct PgServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    /// `Some("postgres")` when commands run through `runuser` (the test runs as root).
    as_user: Option<&'static str>,
}

static SHARED: Mutex<Weak<PgServer>> = Mutex::new(Weak::new());
static DBS: AtomicU32 = AtomicU32::new(0);

/// The newest `/usr/lib/postgresql/N/bin` holding `initdb`, `pg_ctl` and `postgres`.
fn server_bin() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            ["initdb", "pg_ctl", "postgres"]
                .iter()
                .all(|p| tools::which(&bin.join(p).to_string_lossy()).is_some())
                .then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local addr").port()
}

impl PgServer {
    /// The binary's shared server, started on first use; `None` (after a recorded skip) when
    /// PostgreSQL is not installed.
    pub fn shared(test: &str) -> Option<Arc<PgServer>> {
        let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slot.upgrade() {
            return Some(s);
        }
        let s = Arc::new(PgServer::start(test)?);
        *slot = Arc::downgrade(&s);
        Some(s)
    }

    /// A server of its own (a test that restarts or kills it).
    pub fn start(test: &str) -> Option<PgServer> {
        let Some(bin) = server_bin() else {
            tools::skip(
                test,
                "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin",
                INSTALL,
            );
            return None;
        };
        let as_user = is_root().then_some("postgres");
        if as_user.is_some() && tools::which("runuser").is_none() {
            tools::skip(
                test,
                "runuser not found (needed to run postgres as root)",
                "apt-get install -y util-linux",
            );
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("herald-pg-")
            .tempdir()
            .expect("temp dir");
        let mut s = PgServer {
            bin,
            dir,
            port: 0,
            as_user,
        };
        if let Some(user) = as_user {
            let out = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(s.dir.path())
                .output()
                .expect("run chown");
            assert!(
                out.status.success(),
                "chown: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let data = s.data_dir();
        let out = s.pg(
            "initdb",
            &[
                "-D",
                &data.to_string_lossy(),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            ],
        );
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A port taken between our probe and the server's bind fails the start: try another.
        for _ in 0..5 {
            s.port = free_port();
            if s.pg_ctl_start() {
                return Some(s);
            }
        }
        panic!(
            "postgres did not start; its log:\n{}",
            std::fs::read_to_string(s.log_file()).unwrap_or_default()
        );
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// Runs one of the server's programs (as `postgres` when root).
    fn pg(&self, program: &str, args: &[&str]) -> Output {
        let path = self.bin.join(program);
        let mut cmd = match self.as_user {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(&path);
                c
            }
            None => Command::new(&path),
        };
        // The server's programs must not pick up a caller's PG* settings.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("PG") {
                cmd.env_remove(k);
            }
        }
        cmd.args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", path.display()))
    }

    /// `pg_ctl start -w`: waits (its own polling, with its own deadline) until the server
    /// accepts connections. `track_commit_timestamp` is on for every test server (it costs a
    /// few bytes per commit): the epoch audit (`audit.rs`) orders commits by
    /// `pg_xact_commit_timestamp`.
    fn pg_ctl_start(&self) -> bool {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=on -c track_commit_timestamp=on",
            self.port,
            self.dir.path().display()
        );
        self.pg(
            "pg_ctl",
            &[
                "-D",
                &self.data_dir().to_string_lossy(),
                "-l",
                &self.log_file().to_string_lossy(),
                "-w",
                "-t",
                "60",
                "-o",
                &opts,
                "start",
            ],
        )
        .status
        .success()
    }

    /// Stops the server with `mode` (`fast`, or `immediate`: a crash) and starts it again on
    /// the same port.
    pub fn restart(&self, mode: &str) {
        self.stop_now(mode);
        self.start_again();
    }

    /// Stops the server with `mode`; [`Self::start_again`] brings it back on the same port.
    pub fn stop_now(&self, mode: &str) {
        let out = self.stop(mode);
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops every process of the server (SIGSTOP): connections stay open and statements hang
    /// with no answer, as on a stalled host. [`Self::thaw`] lets them go on.
    pub fn freeze(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    pub fn thaw(&self) {
        self.signal_all(libc::SIGCONT);
    }

    /// `signal` to the postmaster (its pid is the first line of `postmaster.pid`) and to its
    /// children (the backends, found by their parent in `/proc`).
    fn signal_all(&self, signal: libc::c_int) {
        let file = std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .expect("postmaster.pid");
        let postmaster: libc::pid_t = file
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .expect("a pid on postmaster.pid's first line");
        let mut pids = vec![postmaster];
        for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<libc::pid_t>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`: the name may hold spaces, so read after its `)`.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<libc::pid_t>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        for pid in pids {
            // SAFETY: kill(2) on the test's own server and its backends.
            unsafe { libc::kill(pid, signal) };
        }
    }

    pub fn start_again(&self) {
        assert!(self.pg_ctl_start(), "postgres did not start again");
    }

    fn stop(&self, mode: &str) -> Output {
        self.pg(
            "pg_ctl",
            &[
                "-D",
                &self.data_dir().to_string_lossy(),
                "-m",
                mode,
                "-w",
                "stop",
            ],
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// A fresh, empty database for one test; answers its URL.
    pub fn create_db(&self, name: &str) -> String {
        let db = format!("{name}_{}", DBS.fetch_add(1, Ordering::Relaxed));
        let port = self.port.to_string();
        let out = self.pg(
            "createdb",
            &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", &db],
        );
        assert!(
            out.status.success(),
            "createdb {db}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.url(&db)
    }

    /// A fresh database with herald's schema and `shards` shard rows (the cluster tests').
    pub fn create_herald_db(&self, name: &str, shards: u32) -> String {
        let url = self.create_db(name);
        let opts = herald::store::pg::PgOptions {
            shards,
            ..herald::store::pg::PgOptions::default()
        };
        drop(herald::store::pg::PgBackend::open(&url, &opts).expect("herald's schema is made"));
        url
    }

    /// Runs `sql` in the database of `url` with `psql` (for a test's own setup), answering
    /// its unaligned output.
    pub fn psql(&self, url: &str, sql: &str) -> String {
        let out = self.pg(
            "psql",
            &[
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                url,
                "-c",
                sql,
            ],
        );
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Makes `role` a login role with `password`, owning a new database it answers the URL
    /// of (without the password), and makes the server ask that role for its password
    /// (`scram-sha-256` over TCP; everyone else stays trusted).
    pub fn password_role(&self, role: &str, password: &str) -> String {
        let admin = self.url("postgres");
        self.psql(
            &admin,
            &format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"),
        );
        let url = self.create_db(role);
        let db = url.rsplit('/').next().expect("db").to_string();
        self.psql(&admin, &format!("ALTER DATABASE {db} OWNER TO {role}"));
        let hba = self.data_dir().join("pg_hba.conf");
        let old = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
        // First match wins: the role's line goes before the trust lines.
        let new = format!("host all {role} 127.0.0.1/32 scram-sha-256\n{old}");
        std::fs::write(&hba, new).expect("write pg_hba.conf");
        let out = self.pg(
            "pg_ctl",
            &["-D", &self.data_dir().to_string_lossy(), "reload"],
        );
        assert!(
            out.status.success(),
            "pg_ctl reload: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // A reload is asynchronous: wait until the role is asked for its password.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let role_url = format!("postgres://{role}@127.0.0.1:{}/{db}", self.port);
        loop {
            let o = self.pg("psql", &["-X", "-w", "-d", &role_url, "-c", "SELECT 1"]);
            if !o.status.success() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the server still lets {role} in without a password"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        role_url
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let out = self.stop("fast");
        if !out.status.success() {
            eprintln!("pg_ctl stop: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

/// `HERALD_TEST_STORE=pg`: the shared suites run on PostgreSQL instead of sled, through the
/// same helpers (`common/herald.rs` asks [`harness_url`] at every start). One harness for
/// both backends: no suite is copied.
pub fn harness_is_pg() -> bool {
    std::env::var("HERALD_TEST_STORE").is_ok_and(|v| v == "pg")
}

/// The test binary's server for the harness, stopped at exit (`atexit`: the suites' helpers
/// hand out `Server`s, which cannot hold it).
static HARNESS: Mutex<Option<PgServer>> = Mutex::new(None);
/// Data directory → the database that stands for it, so a restart on the same directory
/// finds its tasks, and a directory never seen gets a fresh database.
static HARNESS_DBS: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

extern "C" fn stop_harness() {
    let server = HARNESS.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(server);
}

/// With `HERALD_TEST_STORE=pg`, the URL of the database for a herald on `data_dir`;
/// `None` on sled. A missing PostgreSQL fails loudly here: the run asked for it.
pub fn harness_url(data_dir: &Path) -> Option<String> {
    if !harness_is_pg() {
        return None;
    }
    let mut dbs = HARNESS_DBS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, url)) = dbs.iter().find(|(d, _)| d == data_dir) {
        return Some(url.clone());
    }
    let mut slot = HARNESS.lock().unwrap_or_else(|e| e.into_inner());
    if slot.is_none() {
        let server = PgServer::start("HERALD_TEST_STORE=pg")
            .unwrap_or_else(|| panic!("HERALD_TEST_STORE=pg needs a PostgreSQL server: {INSTALL}"));
        *slot = Some(server);
        // SAFETY: registers a plain function with no arguments; it runs once at exit.
        unsafe { libc::atexit(stop_harness) };
    }
    let url = slot.as_ref().expect("started").create_db("suite");
    dbs.push((data_dir.to_path_buf(), url.clone()));
    Some(url)
}

/// A plain client of the database of `url`, its connection driven on a task of its own.
pub async fn client(url: &str) -> tokio_postgres::Client {
    let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    c
}

/// Waits until a backend of the database is blocked on a lock (`pg_stat_activity`).
pub async fn someone_waits_on_a_lock(c: &tokio_postgres::Client) -> bool {
    super::herald::poll(std::time::Duration::from_secs(10), || async {
        let r = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap();
        (r.get::<_, i64>(0) > 0).then_some(())
    })
    .await
    .is_some()
}
