//! README's test command (`scripts/test`) on a machine that lacks a program a test needs:
//! without `CI` it exits 0 and its summary lists the skip with the install command; with
//! `CI=true` the missing program fails the run.
//!
//! Cheap by construction: the whole suite is not run from here. `scripts/test` runs with a PATH
//! that holds only the few programs the script itself uses and a `cargo` stand-in, and the
//! stand-in re-executes this test binary for one probe test that needs chromedriver (the
//! standard "re-exec the test binary with an env var" trick). So the script's real logic
//! (clear the list, run, print the summary, keep the exit status) and `tools::require`'s real
//! rule run together, and chromedriver is missing from that PATH whatever this machine has.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::tools;

/// Set by the `cargo` stand-in: the probe below then does its work.
const PROBE: &str = "HERALD_FRESH_MACHINE_PROBE";
const CHROMEDRIVER_INSTALL: &str = "sudo apt-get install -y chromium chromium-driver";

/// A test that needs chromedriver, as tests/dashboard.rs does. Outside a re-exec it does
/// nothing (it must not look for chromedriver on the real PATH and record a skip there).
#[test]
fn probe_needs_chromedriver() {
    if std::env::var_os(PROBE).is_none() {
        return;
    }
    let Some(path) = tools::require(
        "chromedriver",
        CHROMEDRIVER_INSTALL,
        "fresh_machine::probe_needs_chromedriver",
    ) else {
        return;
    };
    panic!("the probe's PATH should lack chromedriver, found {path:?}");
}

struct Run {
    code: Option<i32>,
    output: String,
    skips: String,
}

/// `scripts/test` with a PATH of only the programs it uses plus a `cargo` that runs the probe.
fn run_test_command(dir: &Path, ci: Option<&str>) -> Run {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    for program in ["bash", "dirname", "mkdir", "wc", "sed", "cat"] {
        let real = tools::which(program)
            .unwrap_or_else(|| panic!("{program} is needed to run scripts/test"));
        let link = bin.join(program);
        if !link.exists() {
            std::os::unix::fs::symlink(real, link).expect("symlink");
        }
    }
    // The stand-in ignores cargo's arguments (`test --locked --no-fail-fast`) and runs the
    // probe in this very binary, as `cargo test` would run it.
    let cargo = bin.join("cargo");
    std::fs::write(
        &cargo,
        "#!/bin/sh\nexec \"$HERALD_PROBE_EXE\" --exact probe_needs_chromedriver --test-threads=1\n",
    )
    .expect("cargo stand-in");
    std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert!(
        !bin.join("chromedriver").exists(),
        "the probe's PATH must lack chromedriver"
    );

    let skips = dir.join("skips.txt");
    let mut cmd = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test"));
    cmd.env("PATH", &bin)
        .env("HERALD_TEST_SKIPS", &skips)
        .env(
            "HERALD_PROBE_EXE",
            std::env::current_exe().expect("test exe"),
        )
        .env(PROBE, "1")
        // The PostgreSQL re-run of the shared suites is not what this probes.
        .env("HERALD_TEST_PG", "0")
        .env_remove("CI");
    if let Some(v) = ci {
        cmd.env("CI", v);
    }
    let out = cmd.output().expect("run scripts/test");
    Run {
        code: out.status.code(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        skips: std::fs::read_to_string(&skips).unwrap_or_default(),
    }
}

#[test]
fn without_ci_a_missing_program_is_a_listed_skip_and_the_command_passes() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A stale entry from an earlier run: the command clears the list before it runs.
    std::fs::write(
        dir.path().join("skips.txt"),
        "SKIP stale: from an earlier run\n",
    )
    .expect("stale list");
    let run = run_test_command(dir.path(), None);
    assert_eq!(run.code, Some(0), "scripts/test must pass:\n{}", run.output);
    let line = format!(
        "SKIP fresh_machine::probe_needs_chromedriver: chromedriver not found on PATH; install with: {CHROMEDRIVER_INSTALL}"
    );
    assert_eq!(
        run.skips.trim(),
        line,
        "the list holds this run's skip only"
    );
    assert!(
        run.output.contains("1 test(s) SKIPPED") && run.output.contains(&line),
        "the summary at the end lists the skip:\n{}",
        run.output
    );
    assert!(
        run.output
            .contains("everything the full suite uses: sudo apt-get install -y"),
        "the summary names the one-line install:\n{}",
        run.output
    );
}

#[test]
fn with_ci_true_a_missing_program_fails_the_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = run_test_command(dir.path(), Some("true"));
    assert!(
        matches!(run.code, Some(c) if c != 0),
        "CI=true: scripts/test must fail, got {:?}:\n{}",
        run.code,
        run.output
    );
    assert!(
        run.output
            .contains("CI=true: a missing tool is a failure, not a skip"),
        "{}",
        run.output
    );
    assert!(
        !run.output.contains("SKIPPED"),
        "nothing is skipped under CI:\n{}",
        run.output
    );
}
