//! A seeded simulation of the whole engine on the manual clock: random creates, cancels,
//! pauses, resumes, triggers, patches, time advances, receiver outcomes (2xx, 500, 429,
//! 400) and restarts, checked against a simple reference model after every step:
//!
//! - no send of a task after its cancel or pause answered (until a resume);
//! - nothing before a cursor is sent again (per run, sequence numbers never go back);
//! - a key that was answered 2xx is sent again only across a restart, as the in-flight
//!   message, with a higher attempt number;
//! - one-shot runs are scheduled at the task's instant (or the trigger's), cron runs on the
//!   cron's whole seconds;
//! - at the end (receiver healthy, everything resumed, time run out) every unfinished task
//!   completed and every message of every started run was delivered or is in the failure list.
//!
//! It runs twice: to a webhook receiver that fails on command, and to a file channel with the
//! one-shots on whole seconds, so that sends due together go, and settle, a chunk at a time
//! (`engine/chunk.rs`).
//!
//! It prints its seed on failure. CI runs `SEEDS` fixed seeds; `HERALD_SIM_SEEDS=N` runs N
//! more (from `HERALD_SIM_SEED`, default 1).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};

use common::herald::{utc_ms, ManualHerald};
use common::http;
use common::receiver::{Behavior, Receiver};
use serde_json::{json, Value};

const SEEDS: [u64; 3] = [11, 22, 33];
const STEPS: usize = 120;
const T0: &str = "2026-12-01T00:00:00Z";

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    Live,
    Paused,
    Cancelled,
}

#[derive(Debug)]
struct TaskModel {
    state: Model,
    /// Deliveries of this task the receiver had when it was cancelled or paused.
    frozen_at: Option<usize>,
    cron: bool,
    /// The instant a one-shot was created for (`after`), or triggered at.
    one_shot_at: Vec<u64>,
}

struct Sim {
    h: ManualHerald,
    rx: Receiver,
    /// Tasks go to the file channel `out` (its lines are the deliveries), not the receiver.
    file: bool,
    rng: Rng,
    seed: u64,
    tasks: BTreeMap<String, TaskModel>,
    restarts: usize,
    /// Receiver requests already checked, and what was learnt from them.
    checked: usize,
    last_seq: HashMap<(String, u64), u64>,
    ok_keys: HashMap<String, u64>,
    /// Number of restarts when each 2xx key was first answered.
    ok_at_restart: HashMap<String, usize>,
}

fn body_of(r: &common::receiver::Recorded) -> &Value {
    r.json.as_ref().expect("json body")
}

impl Sim {
    fn fail(&self, msg: String) -> ! {
        panic!("simulation seed {}: {msg}", self.seed)
    }

    /// Every delivery so far, in order: its body, its idempotency key, and whether it was
    /// answered 2xx (a file channel's line always was).
    fn deliveries(&self) -> Vec<(Value, String, bool)> {
        if self.file {
            return self
                .h
                .sent()
                .into_iter()
                .map(|b| {
                    let key = b["idempotency_key"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    (b, key, true)
                })
                .collect();
        }
        // Requests first: each is recorded with its answer under one lock, so answers read
        // after them cover every one of them.
        let requests = self.rx.requests();
        let answers = self.rx.answers();
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let ok = answers.get(i).is_some_and(|(_, s)| (200..300).contains(s));
                (
                    body_of(r).clone(),
                    r.idempotency_key().unwrap().to_string(),
                    ok,
                )
            })
            .collect()
    }

    fn deliveries_of(&self, id: &str) -> usize {
        self.deliveries()
            .iter()
            .filter(|(b, _, _)| b["task_id"] == id)
            .count()
    }

    fn live_ids(&self, want: Model) -> Vec<String> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.state == want)
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn pick(&mut self, want: Model) -> Option<String> {
        let ids = self.live_ids(want);
        if ids.is_empty() {
            return None;
        }
        let i = self.rng.below(ids.len() as u64) as usize;
        Some(ids[i].clone())
    }

    async fn step(&mut self, n: usize) {
        let now = self.h.now();
        match self.rng.below(100) {
            0..=24 => {
                let id = format!("s{n}");
                let messages = 1 + self.rng.below(4);
                let cron = self.rng.below(5) == 0;
                let schedule = if cron {
                    json!({"cron": "*/5 * * * * *", "max_runs": 1 + self.rng.below(3)})
                } else if self.file {
                    // On whole seconds, so that several are due together.
                    let at = (now / 1_000 + 1 + self.rng.below(8)) * 1_000;
                    json!({"at": rfc3339(at)})
                } else {
                    json!({"after": format!("{}ms", self.rng.below(8_000))})
                };
                let channel = if self.file { "out" } else { "hook" };
                let interval = ["0s", "200ms", "1s"][self.rng.below(3) as usize];
                let v = self
                    .h
                    .post(&json!({"id": id, "channel": channel, "schedule": schedule,
                        "to": (0..messages).map(|i| format!("u{i}")).collect::<Vec<_>>(),
                        "body": "x", "pacing": {"interval": interval}}))
                    .await;
                let at = v["next_fire_at"]
                    .as_str()
                    .map(utc_ms)
                    .unwrap_or_else(|| self.fail(format!("no next fire: {v}")));
                self.tasks.insert(
                    id,
                    TaskModel {
                        state: Model::Live,
                        frozen_at: None,
                        cron,
                        one_shot_at: if cron { vec![] } else { vec![at] },
                    },
                );
            }
            25..=32 => {
                if let Some(id) = self.pick(Model::Live) {
                    self.settle_now(now).await;
                    let r = self.h.action(&id, "cancel").await;
                    self.after_stop(&id, r, Model::Cancelled);
                }
            }
            33..=40 => {
                if let Some(id) = self.pick(Model::Live) {
                    self.settle_now(now).await;
                    let r = self.h.action(&id, "pause").await;
                    self.after_stop(&id, r, Model::Paused);
                }
            }
            41..=48 => {
                if let Some(id) = self.pick(Model::Paused) {
                    let r = self.h.action(&id, "resume").await;
                    match r.status {
                        200 => {
                            let t = self.tasks.get_mut(&id).unwrap();
                            t.state = Model::Live;
                            t.frozen_at = None;
                        }
                        409 => self.sync_finished(&id, &r.json()),
                        s => self.fail(format!("resume {id}: {s} {}", r.text())),
                    }
                }
            }
            49..=53 => {
                if let Some(id) = self.pick(Model::Live) {
                    let r = self.h.action(&id, "trigger").await;
                    match r.status {
                        200 => self.tasks.get_mut(&id).unwrap().one_shot_at.push(now),
                        409 => {}
                        s => self.fail(format!("trigger {id}: {s} {}", r.text())),
                    }
                }
            }
            54..=58 => {
                if let Some(id) = self.pick(Model::Paused) {
                    let r = http::patch_json(
                        &self.h.url(&format!("/v1/tasks/{id}")),
                        &json!({"metadata": {"patched": "yes"}, "pacing": {"interval": "300ms"}}),
                    )
                    .await;
                    if ![200, 409].contains(&r.status) {
                        self.fail(format!("patch {id}: {} {}", r.status, r.text()));
                    }
                }
            }
            59..=66 => {
                let mode = self.rng.below(5);
                let seed = self.rng.next();
                match mode {
                    0 => self.rx.fail_rate(0.3, 500, seed),
                    1 => self.rx.fail_rate(0.3, 429, seed),
                    2 => self.rx.fail_rate(0.1, 400, seed),
                    _ => self.rx.fail_rate(0.0, 200, seed),
                }
            }
            67..=70 => {
                self.h.restart().await;
                self.restarts += 1;
            }
            _ => {
                let dt = self.rng.below(5_000);
                self.h.run_until(now + dt).await;
            }
        }
        self.check();
    }

    /// Lets what is due at `now` finish, the clock unmoved. A command's own effects (a trigger's
    /// send, a resumed run's next step) run after it answers; a send that started before a
    /// cancel or pause may finish after it (DESIGN: only a send not yet started is stopped),
    /// which the model cannot tell from one started after it. So cancels and pauses go when
    /// nothing is in flight, and then no send of the task may follow.
    async fn settle_now(&self, now: u64) {
        self.h.run_until(now).await;
    }

    fn after_stop(&mut self, id: &str, r: common::http::Resp, to: Model) {
        match r.status {
            200 => {
                let count = self.deliveries_of(id);
                let t = self.tasks.get_mut(id).unwrap();
                t.state = to;
                t.frozen_at = Some(count);
            }
            409 => self.sync_finished(id, &r.json()),
            s => self.fail(format!("{to:?} {id}: {s} {}", r.text())),
        }
    }

    /// A 409 says the task is finished (completed): the model follows.
    fn sync_finished(&mut self, id: &str, problem: &Value) {
        let detail = problem["detail"].as_str().unwrap_or_default();
        if !(detail.contains("completed")
            || detail.contains("running")
            || detail.contains("pending"))
        {
            self.fail(format!("{id}: unexpected conflict {problem}"));
        }
    }

    /// The invariants over what the receiver saw so far.
    fn check(&mut self) {
        let reqs = self.deliveries();
        for (b, key, ok) in reqs.iter().skip(self.checked) {
            let id = b["task_id"].as_str().unwrap().to_string();
            let run = b["run"].as_u64().unwrap();
            let seq = b["seq"].as_u64().unwrap();
            let attempt = b["attempt"].as_u64().unwrap();
            let key = key.clone();
            if key != format!("{id}:{run}:{seq}") {
                self.fail(format!("key {key} for {id} run {run} seq {seq}"));
            }
            // Nothing before a cursor again.
            let last = *self.last_seq.get(&(id.clone(), run)).unwrap_or(&seq);
            if seq < last {
                self.fail(format!("{key}: went back from seq {last}"));
            }
            self.last_seq.insert((id.clone(), run), seq);
            // A 2xx'd key again only across a restart, with a new attempt.
            if let Some(prev) = self.ok_keys.get(&key) {
                if self.ok_at_restart[&key] == self.restarts || attempt <= *prev {
                    self.fail(format!("{key} sent again after 2xx without a restart (attempt {attempt} after {prev})"));
                }
            }
            if *ok {
                self.ok_keys.insert(key.clone(), attempt);
                self.ok_at_restart.insert(key.clone(), self.restarts);
            }
            let t = &self.tasks[&id];
            // Schedules: one-shot runs at the created or triggered instant, cron on whole 5 s.
            if seq == 0 {
                let scheduled = utc_ms(b["scheduled_at"].as_str().unwrap());
                if t.cron {
                    // On the cron's whole 5 s, or at a trigger.
                    if !scheduled.is_multiple_of(5_000) && !t.one_shot_at.contains(&scheduled) {
                        self.fail(format!("{key}: cron run scheduled at {scheduled}"));
                    }
                } else if !t.one_shot_at.contains(&scheduled) {
                    self.fail(format!(
                        "{key}: scheduled at {scheduled}, expected one of {:?}",
                        t.one_shot_at
                    ));
                }
            }
        }
        self.checked = reqs.len();
        // No send after a cancel or pause answered.
        for (id, t) in &self.tasks {
            if let Some(n) = t.frozen_at {
                let now = reqs
                    .iter()
                    .filter(|(b, _, _)| b["task_id"] == id.as_str())
                    .count();
                if now != n {
                    self.fail(format!("{id} is {:?} but sent {} more", t.state, now - n));
                }
            }
        }
    }

    async fn finish(&mut self) {
        self.rx.fail_rate(0.0, 200, 0);
        for id in self.live_ids(Model::Paused) {
            let r = self.h.action(&id, "resume").await;
            if r.status == 200 {
                let t = self.tasks.get_mut(&id).unwrap();
                t.state = Model::Live;
                t.frozen_at = None;
            }
        }
        let end = self.h.now() + 3_600_000;
        self.h.run_until(end).await;
        self.check();
        let failures: HashSet<String> = http::get(&self.h.url("/v1/failures?limit=1000"))
            .await
            .json()["failures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["id"].as_str().unwrap().to_string())
            .collect();
        eprintln!(
            "simulation seed {}: {} tasks ({} cancelled, {} paused at the end), {} deliveries, {} keys 2xx, {} failures, {} restarts",
            self.seed,
            self.tasks.len(),
            self.live_ids(Model::Cancelled).len(),
            self.live_ids(Model::Paused).len(),
            self.deliveries().len(),
            self.ok_keys.len(),
            failures.len(),
            self.restarts
        );
        for id in self.live_ids(Model::Live) {
            let t = self.h.task(&id).await;
            if t["state"] != "completed" {
                self.fail(format!("{id} did not complete: {t}"));
            }
            for run in self.h.runs(&id).await {
                if run["state"] != "completed" {
                    continue; // skipped or expired fires have no messages to send
                }
                let n = run["run"].as_u64().unwrap();
                for seq in 0..run["total"].as_u64().unwrap() {
                    let key = format!("{id}:{n}:{seq}");
                    if !self.ok_keys.contains_key(&key) && !failures.contains(&key) {
                        self.fail(format!("{key} neither delivered nor in the failure list"));
                    }
                }
            }
        }
    }
}

async fn simulate(seed: u64, file: bool) {
    let rx = Receiver::start().await;
    rx.set_default(Behavior::Ok);
    let extra = format!(
        "[channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\nretry = {{ max_attempts = 3, backoff = \"fixed\", initial = \"1s\", max = \"1s\" }}\n",
        rx.url()
    );
    let h = ManualHerald::start(utc_ms(T0), &extra).await;
    let mut sim = Sim {
        h,
        rx,
        file,
        rng: Rng(seed),
        seed,
        tasks: BTreeMap::new(),
        restarts: 0,
        checked: 0,
        last_seq: HashMap::new(),
        ok_keys: HashMap::new(),
        ok_at_restart: HashMap::new(),
    };
    for n in 0..STEPS {
        sim.step(n).await;
    }
    sim.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_simulation_against_the_reference_model() {
    seeds(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_simulation_with_chunked_file_sends() {
    seeds(true).await;
}

fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64)
        .expect("instant")
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

async fn seeds(file: bool) {
    for seed in SEEDS {
        simulate(seed, file).await;
    }
    let more: u64 = std::env::var("HERALD_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let from: u64 = std::env::var("HERALD_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for seed in from..from + more {
        simulate(seed, file).await;
    }
}
