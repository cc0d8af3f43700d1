//! The operator's command line client: `herald tasks|failures|channels|cluster|next`. It talks to a
//! running herald over its public HTTP API (`client.rs`), except `herald next`, which previews a
//! schedule offline with the server's own schedule code (`next.rs`).
//!
//! Every command prints a readable table or summary, or with `--json` the API's JSON. Errors
//! are one line on stderr and a non-zero exit (see [`CliError`]).

mod backup;
mod client;
mod cluster;
mod failures;
mod lang;
mod next;
pub mod output;
mod table;
mod tasks;
mod timeline;
mod watch;

use clap::{Args, Subcommand};

use output::outln;

pub use client::{CliError, Client};

/// Where herald listens when nothing else is said (`listen` in the embedded defaults).
pub const DEFAULT_URL: &str = "http://127.0.0.1:7700";

/// How to reach herald and how to print; accepted anywhere after the command name.
#[derive(Args, Debug, Clone)]
pub struct Conn {
    /// herald's base URL.
    #[arg(long, env = "HERALD_URL", default_value = DEFAULT_URL, global = true)]
    pub url: String,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Language of schedule descriptions: en or zh (default: the locale, LC_ALL / LC_MESSAGES /
    /// LANG).
    #[arg(long, global = true)]
    pub lang: Option<String>,
}

impl Conn {
    /// A client of the herald at `--url`, asking for the chosen language.
    fn client(&self) -> Result<Client, CliError> {
        Ok(Client::new(&self.url)?.lang(lang::from_env(self.lang.as_deref())?))
    }
}

/// The client commands (`herald serve` and `herald completions` are in `main.rs`).
#[derive(Subcommand, Debug)]
pub enum Command {
    /// List, inspect, watch, create and control tasks.
    Tasks {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: TasksCmd,
    },
    /// The failure list: messages whose retries were exhausted.
    Failures {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        cmd: FailuresCmd,
    },
    /// Configured channels with their limiter and breaker state.
    Channels {
        #[command(flatten)]
        conn: Conn,
    },
    /// Cluster mode: the nodes, and per shard its epoch, owner and lease expiry.
    Cluster {
        #[command(flatten)]
        conn: Conn,
    },
    /// When a schedule fires next (offline, with the server's schedule code).
    Next(next::NextArgs),
    /// Write every task, run, failure and idempotency key as JSON lines to standard output:
    /// from the data directory of a stopped herald (--data) or from a running one (--url).
    Export(backup::ExportArgs),
    /// Restore an export into a new or empty data directory (standard input or -f FILE).
    Import(backup::ImportArgs),
}

#[derive(Subcommand, Debug)]
pub enum TasksCmd {
    /// A page of tasks: id, state, schedule in words, next fire, progress.
    List {
        /// Only tasks in this state (pending, running, paused, completed, cancelled, failed, expired).
        #[arg(long)]
        state: Option<String>,
        /// Only tasks on this channel.
        #[arg(long)]
        channel: Option<String>,
        /// Tasks per page (1-1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Start after this task id (the `next` of the previous page).
        #[arg(long, value_parser = task_id)]
        after: Option<String>,
    },
    /// One task in detail.
    Show {
        #[arg(value_parser = task_id)]
        id: String,
    },
    /// Live progress bars of the task's running sequence, until the run finishes.
    Watch {
        #[arg(value_parser = task_id)]
        id: String,
    },
    /// Create a task from a JSON file (`-` reads standard input).
    Create {
        /// The task request (API.md `POST /v1/tasks`).
        #[arg(short = 'f', long = "file")]
        file: String,
        /// Sent as `Idempotency-Key`: repeating the command does not create a second task.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Give a one-shot task (`at` or `after`) a new time: its schedule becomes `{"at": ...}`;
    /// re-arms an expired task. Any other schedule (cron, reminders) is refused unless --force.
    Reschedule {
        #[arg(value_parser = task_id)]
        id: String,
        /// The new instant (RFC 3339, or local time with --tz).
        #[arg(long)]
        at: String,
        /// The zone of a local --at.
        #[arg(long)]
        tz: Option<String>,
        /// Replace a cron or reminders schedule too: the task then fires once, at --at.
        #[arg(long)]
        force: bool,
    },
    /// Send the missed runs of a range: one run per slot without a completed run, in order.
    Backfill {
        #[arg(value_parser = task_id)]
        id: String,
        /// Start of the range (RFC 3339).
        #[arg(long)]
        from: String,
        /// End of the range (RFC 3339), at most 1000 slots after `from`.
        #[arg(long)]
        to: String,
    },
    /// Cancel a task: no send of it starts afterwards.
    Cancel {
        #[arg(value_parser = task_id)]
        id: String,
    },
    /// Hold all sends of a task.
    Pause {
        #[arg(value_parser = task_id)]
        id: String,
    },
    /// Continue a paused task.
    Resume {
        #[arg(value_parser = task_id)]
        id: String,
    },
    /// Start a run now.
    Trigger {
        #[arg(value_parser = task_id)]
        id: String,
    },
    /// The task's runs, with cursors and outcomes, oldest first.
    Runs {
        #[arg(value_parser = task_id)]
        id: String,
        /// Runs per page (1-1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Start after this run number (the `next` of the previous page).
        #[arg(long)]
        after: Option<u32>,
    },
    /// Delete a finished task with its runs; an unfinished task is cancelled instead (as
    /// `cancel` does: it stays readable as cancelled), and deleted by a second delete.
    Delete {
        #[arg(value_parser = task_id)]
        id: String,
    },
    /// Every step herald took for the task, oldest first: created, fired, each attempt with
    /// its answer, retries and holds, delivered or failed.
    Timeline {
        #[arg(value_parser = task_id)]
        id: String,
        /// Only the events of this run.
        #[arg(long)]
        run: Option<u32>,
        /// Events per page (1-1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Start after this seq (the `next` of the previous page).
        #[arg(long)]
        after: Option<u64>,
    },
}

#[derive(Subcommand, Debug)]
pub enum FailuresCmd {
    /// A page of the failure list.
    List {
        /// Only failures of this task.
        #[arg(long, value_parser = task_id)]
        task: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        #[arg(long, value_parser = failure_id)]
        after: Option<String>,
    },
    /// Send a failed message again (same idempotency key).
    Retry {
        #[arg(value_parser = failure_id)]
        id: String,
    },
    /// Remove a message from the failure list.
    Dismiss {
        #[arg(value_parser = failure_id)]
        id: String,
    },
}

/// clap's check of a task id argument, by herald's own rule (`model::check_id`): a bad one
/// is refused before any request (exit 2, naming the argument). An empty id would otherwise
/// ask for `/v1/tasks/`, the list, and `tasks show ""` printed it as a task's detail.
fn task_id(s: &str) -> Result<String, String> {
    crate::model::check_id(s).map(|()| s.to_string())
}

/// [`task_id`] for a failure id (`{task}:{run}:{seq}`: the same alphabet, longer).
fn failure_id(s: &str) -> Result<String, String> {
    crate::model::id::check_id_len(s, crate::model::id::FAILURE_ID_LEN_MAX).map(|()| s.to_string())
}

/// Runs a client command; output goes to stdout, the error (if any) is for `main` to print.
pub fn run(cmd: Command) -> Result<(), CliError> {
    if let Command::Next(args) = cmd {
        return next::run(args);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Local(format!("starting the runtime: {e}")))?;
    rt.block_on(async move {
        match cmd {
            Command::Tasks { conn, cmd } => {
                let c = conn.client()?;
                tasks::run(&c, conn.json, cmd).await
            }
            Command::Failures { conn, cmd } => {
                let c = conn.client()?;
                failures::run(&c, conn.json, cmd).await
            }
            Command::Channels { conn } => {
                let c = conn.client()?;
                failures::channels(&c, conn.json).await
            }
            Command::Cluster { conn } => {
                let c = conn.client()?;
                cluster::show(&c, conn.json).await
            }
            Command::Export(args) => backup::export_cmd(args).await,
            Command::Import(args) => backup::import_cmd(args).await,
            Command::Next(_) => Ok(()),
        }
    })
}

/// Prints JSON as the API gave it (pretty).
fn print_json(v: &serde_json::Value) {
    outln!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}
