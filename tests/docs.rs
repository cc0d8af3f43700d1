//! The documentation a newcomer follows is checked against the code: docs/API.md names every
//! path and method of the OpenAPI document and no other, README's links stay inside the
//! repository, README's example config starts the real binary, and README's walk-through and
//! command-line block run as written against a real herald.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::herald::{poll, Proc};
use common::http;

const METHODS: [&str; 6] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"];

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `METHOD /path` pairs written in backticks (`` `GET /v1/tasks?limit=` ``), query dropped.
fn documented(md: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for chunk in md.split('`').skip(1).step_by(2) {
        let Some((m, path)) = chunk.split_once(' ') else {
            continue;
        };
        if METHODS.contains(&m) && path.starts_with('/') {
            let path = path.split(['?', ' ']).next().unwrap_or(path);
            out.insert((m.to_string(), path.to_string()));
        }
    }
    out
}

#[test]
fn docs_api_md_and_the_openapi_document_name_the_same_operations() {
    let doc: serde_json::Value = serde_json::from_str(herald::api::OPENAPI).unwrap();
    let mut spec = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in item.as_object().unwrap().keys() {
            let m = m.to_ascii_uppercase();
            if METHODS.contains(&m.as_str()) {
                spec.insert((m, path.clone()));
            }
        }
    }
    let md = documented(&read("docs/API.md"));
    let missing: Vec<_> = spec.difference(&md).collect();
    let extra: Vec<_> = md.difference(&spec).collect();
    assert!(
        missing.is_empty(),
        "in openapi.json, not in docs/API.md: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "in docs/API.md, not in openapi.json: {extra:?}"
    );
}

#[test]
fn readme_links_point_inside_the_repository() {
    let readme = read("README.md");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut links = 0;
    for part in readme.split("](").skip(1) {
        let target = part.split(')').next().unwrap_or("");
        if target.starts_with("http://")
            || target.starts_with("https://")
            || target.starts_with('#')
        {
            continue;
        }
        links += 1;
        let file = target.split('#').next().unwrap_or(target);
        assert!(
            !file.starts_with("../"),
            "README links outside the repository: {target}"
        );
        assert!(
            root.join(file).exists(),
            "README links to a missing file: {target}"
        );
    }
    assert!(links > 0, "README has relative links");
    assert!(
        readme.contains("](docs/API.md)"),
        "README links the API reference"
    );
}

/// The first TOML block of README's "## Configuration" section.
fn readme_config() -> String {
    let readme = read("README.md");
    let section = readme
        .split_once("\n## Configuration\n")
        .expect("README has a Configuration section")
        .1;
    let block = section.split_once("```toml\n").expect("a toml block").1;
    block.split_once("```").expect("closed").0.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_config_starts_herald() {
    let text = readme_config();
    assert!(text.contains("[channels."), "the example config: {text}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("herald.toml");
    std::fs::write(&cfg, &text).unwrap();
    // As written: relative paths (data_dir, the file channel) from the working directory. Only
    // the port is overridden, so that tests may run side by side.
    let mut cmd = Proc::command(&cfg, &dir.path().join("herald-data"));
    cmd.current_dir(dir.path());
    let p = Proc::start(cmd);
    let url = format!("{}/healthz", p.url);
    let ok = poll(Duration::from_secs(30), || {
        let url = url.clone();
        async move {
            let r = http::try_request("GET", &url, &[], None).await.ok()?;
            (r.status == 200).then_some(())
        }
    })
    .await;
    assert!(
        ok.is_some(),
        "/healthz did not answer 200 with README's config"
    );
    let channels = http::get(&format!("{}/v1/channels", p.url)).await;
    assert_eq!(channels.status, 200);
    let names: Vec<String> = channels.json()["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(names.iter().any(|n| n == "wechat"), "{names:?}");
}

/// The text of README's `## {title}` section, up to the next `## ` heading.
fn readme_section(readme: &str, title: &str) -> String {
    let start = format!("\n## {title}\n");
    let rest = readme
        .split_once(start.as_str())
        .unwrap_or_else(|| panic!("README has a {title:?} section"))
        .1;
    rest.split("\n## ").next().unwrap_or(rest).to_string()
}

/// The bodies of the ```sh blocks of a markdown text.
fn sh_blocks(md: &str) -> Vec<String> {
    md.split("```sh\n")
        .skip(1)
        .map(|b| {
            b.split_once("```")
                .map(|(body, _)| body)
                .unwrap_or(b)
                .to_string()
        })
        .collect()
}

/// One shell command of a README block: its words (quotes removed, `\`-newlines joined) and the
/// comment lines that follow it (README writes an expected answer there: `# 422 {...}`).
#[derive(Debug, Default)]
struct ShellCommand {
    words: Vec<String>,
    after: Vec<String>,
}

/// Splits a block the way sh would for the simple commands README uses: single and double
/// quotes, backslash escapes, `\` + newline as a continuation, `#` comments.
fn shell_commands(block: &str) -> Vec<ShellCommand> {
    let mut out: Vec<ShellCommand> = Vec::new();
    let mut cur = ShellCommand::default();
    let mut word: Option<String> = None;
    let mut chars = block.chars().peekable();
    let end_word = |word: &mut Option<String>, cur: &mut ShellCommand| {
        if let Some(w) = word.take() {
            cur.words.push(w);
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    w.push(q);
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => match chars.next() {
                            Some(e @ ('"' | '\\' | '$' | '`')) => w.push(e),
                            Some(e) => {
                                w.push('\\');
                                w.push(e);
                            }
                            None => {}
                        },
                        _ => w.push(q),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(e) => word.get_or_insert_with(String::new).push(e),
            },
            '#' if word.is_none() => {
                let mut comment = String::from("#");
                while let Some(&q) = chars.peek() {
                    if q == '\n' {
                        break;
                    }
                    comment.push(q);
                    chars.next();
                }
                // A comment on a line of its own belongs to the command before it.
                match out.last_mut() {
                    Some(prev) if cur.words.is_empty() => prev.after.push(comment),
                    _ => cur.after.push(comment),
                }
            }
            ' ' | '\t' => end_word(&mut word, &mut cur),
            '\n' => {
                end_word(&mut word, &mut cur);
                if !cur.words.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => word.get_or_insert_with(String::new).push(c),
        }
    }
    end_word(&mut word, &mut cur);
    if !cur.words.is_empty() {
        out.push(cur);
    }
    out
}

/// A curl command line as a request: method, URL, headers, body, with README's address
/// replaced by `base`. `-d` without a content type sends curl's own default content type.
fn curl_request(
    words: &[String],
    base: &str,
) -> (String, String, Vec<(String, String)>, Option<String>) {
    let mut method = None;
    let mut url = None;
    let mut headers = Vec::new();
    let mut body = None;
    let mut it = words.iter().skip(1);
    while let Some(w) = it.next() {
        match w.as_str() {
            "-s" | "-N" | "-sS" => {}
            "-X" => method = it.next().cloned(),
            "-H" => {
                let h = it.next().expect("-H takes a header");
                let (k, v) = h.split_once(':').expect("a header is `name: value`");
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
            "-d" => body = it.next().cloned(),
            u if u.starts_with("http://127.0.0.1:7700") => {
                url = Some(u.replacen("http://127.0.0.1:7700", base, 1))
            }
            u if u.starts_with("localhost:7700") => {
                url = Some(u.replacen("localhost:7700", base, 1))
            }
            other => panic!("README's curl uses {other:?}, which this test does not know"),
        }
    }
    if body.is_some()
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        headers.push((
            "content-type".into(),
            "application/x-www-form-urlencoded".into(),
        ));
    }
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.into());
    (
        method,
        url.expect("a curl command has a URL"),
        headers,
        body,
    )
}

/// Runs `bash -e -o pipefail -c script` in `dir` with `env`, killed after `deadline`; answers
/// the exit status and what it printed.
fn run_bash(
    dir: &Path,
    script: &str,
    env: &[(&str, String)],
    deadline: Duration,
) -> (Option<i32>, String) {
    use std::io::Read;
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-e", "-o", "pipefail", "-c", script])
        .current_dir(dir)
        .env_remove("HERALD_TOKEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("bash");
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let end = std::time::Instant::now() + deadline;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "README's command-line block did not finish within {deadline:?}; so far:\n{}",
                t_out.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = format!(
        "{}{}",
        t_out.join().unwrap_or_default(),
        t_err.join().unwrap_or_default()
    );
    (status.code(), output)
}

/// README's walk-through, command by command as written there, against a real herald; then
/// its command-line block, as a bash script, against the same herald with the real binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_walk_through_and_command_line_run_as_written() {
    let readme = read("README.md");
    let h = common::herald::TestHerald::start("").await;
    let base = h.server.url();

    let walk = readme_section(&readme, "Walk-through");
    let mut curls = 0;
    for block in sh_blocks(&walk) {
        for cmd in shell_commands(&block) {
            assert_eq!(
                cmd.words[0], "curl",
                "the walk-through is curl commands: {cmd:?}"
            );
            curls += 1;
            let (method, url, headers, body) = curl_request(&cmd.words, &base);
            let hdrs: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let r = http::request(&method, &url, &hdrs, body.clone().map(String::into_bytes)).await;
            // `# 422 {...}` after a command: the answer README shows; otherwise a success.
            let shown = cmd.after.first().and_then(|c| {
                let code = c.strip_prefix("# ")?.get(..3)?;
                code.parse::<u16>().ok()
            });
            let text = r.text();
            match shown {
                Some(code) => {
                    assert_eq!(r.status, code, "{method} {url} {body:?}: {text}");
                    let said = cmd.after.join(" ");
                    if let Some(field) = said.split("\"field\":\"").nth(1) {
                        let field = field.split('"').next().unwrap_or("");
                        assert_eq!(r.json()["field"], field, "{text}");
                    }
                }
                None => assert!(
                    (200..300).contains(&r.status),
                    "README's walk-through: {method} {url} {body:?} answered {}: {text}",
                    r.status
                ),
            }
        }
    }
    assert!(
        curls >= 10,
        "the walk-through's curl commands were found: {curls}"
    );
    // What the walk-through says about its first task.
    let demo = http::get(&format!("{base}/v1/tasks/demo")).await.json();
    assert!(
        demo["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("once, 5s after creation, at ")),
        "{demo}"
    );
    assert_eq!(
        http::get(&format!("{base}/v1/tasks/later")).await.status,
        404,
        "the walk-through deletes `later` (and keeps `demo`)"
    );

    // The block is written for after `demo` has sent its messages (5 s, then 2 s apart).
    common::herald::wait_state(&base, "demo", "completed", Duration::from_secs(30)).await;
    let cli = readme_section(&readme, "The command line");
    let script = sh_blocks(&cli)
        .into_iter()
        .find(|b| b.starts_with("herald tasks list\n"))
        .expect("README's command-line block starts with `herald tasks list`")
        .replace("http://127.0.0.1:7700", &base);
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_herald"))
        .parent()
        .expect("the binary's directory")
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    let env = [("PATH", path), ("HERALD_URL", base.clone())];
    let (code, output) = tokio::task::block_in_place(|| {
        run_bash(dir.path(), &script, &env, Duration::from_secs(90))
    });
    assert_eq!(
        code,
        Some(0),
        "README's command-line block failed:\n{output}"
    );
    assert_eq!(
        http::get(&format!("{base}/v1/tasks/demo2")).await.status,
        404,
        "the block's two deletes cancel, then delete demo2"
    );
    assert!(
        dir.path().join("herald.jsonl").exists() && dir.path().join("herald.bash").exists(),
        "the export and the completion script were written"
    );
}

/// No date README asks herald to schedule has passed (a past `at` is refused with 422).
#[test]
fn readme_schedules_no_past_dates() {
    let readme = read("README.md");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let mut seen = 0;
    for block in sh_blocks(&readme) {
        for key in ["\"at\": \"", "\"event_at\": \"", "--at "] {
            for rest in block.split(key).skip(1) {
                let date = rest.get(..10).unwrap_or("");
                seen += 1;
                assert!(
                    date > today.as_str(),
                    "README schedules {key}{date}, which is not in the future (today {today})"
                );
            }
        }
    }
    assert!(seen >= 5, "README's dated schedules were found: {seen}");
}

/// The systemd unit's `Documentation=` names a file its install steps put there, and README's
/// one-line install of the test programs is the one `scripts/test` prints.
#[test]
fn packaging_points_at_files_that_exist() {
    let unit = read("packaging/herald.service");
    let mut docs = 0;
    for line in unit.lines() {
        let Some(target) = line.strip_prefix("Documentation=") else {
            continue;
        };
        for url in target.split_whitespace() {
            docs += 1;
            let installed = url
                .strip_prefix("file://")
                .unwrap_or_else(|| panic!("Documentation={url}: expected a file:// link"));
            let name = Path::new(installed)
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("");
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(name).exists(),
                "{name} is not in the repository"
            );
            assert!(
                unit.lines().any(|l| l.starts_with('#')
                    && l.contains("install")
                    && l.contains(&format!("{name} {installed}"))),
                "the unit's install steps put {name} at {installed}"
            );
        }
    }
    assert!(docs > 0, "the unit has a Documentation= line");

    let script = read("scripts/test");
    let line = script
        .lines()
        .find_map(|l| l.strip_prefix("install_all=\"")?.strip_suffix('"'))
        .expect("scripts/test names the install line");
    assert!(
        read("README.md").contains(&format!("```sh\n{line}\n```")),
        "README's \"Two commands\" gives scripts/test's install line: {line}"
    );
    assert!(
        read(".ci/run").contains("CI=true scripts/test"),
        ".ci/run runs README's test command"
    );
}

/// herald's own messages that send the operator to a README section name one that exists.
#[test]
fn readme_sections_named_by_error_messages_exist() {
    let readme = read("README.md");
    let mut named = 0;
    for file in ["src/server.rs", "src/main.rs", "src/config.rs"] {
        let src = read(file);
        for rest in src.split("README \\\"").skip(1) {
            let title = rest.split("\\\"").next().unwrap_or("");
            named += 1;
            assert!(
                readme.contains(&format!("\n### {title}\n"))
                    || readme.contains(&format!("\n## {title}\n")),
                "{file} sends the operator to README {title:?}, which has no such section"
            );
        }
    }
    assert!(named > 0, "src/server.rs names README's runbook");
}
