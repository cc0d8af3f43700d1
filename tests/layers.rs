//! The engine's shape, checked on its own source (DESIGN.md "The engine's shape (next)"):
//! one module writes a task, and the layers dispatch → chunk → step → commit → cells → arm →
//! timer import only downwards; and `model`, the bottom layer, imports nothing above it.

use std::path::Path;

const LAYERS: [&str; 7] = [
    "dispatch", "chunk", "step", "commit", "cells", "arm", "timer",
];

fn engine_file(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("src/engine/{name}.rs"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The engine modules a file names: `super::x` in its code (comments left out).
fn uses(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("super::") {
            rest = &rest[i + "super::".len()..];
            let mut name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if name.is_empty() && rest.starts_with('{') {
                // `use super::{a, b::c, ...}`
                let inner: String = rest[1..].chars().take_while(|c| *c != '}').collect();
                for part in inner.split(',') {
                    let n: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !n.is_empty() {
                        out.push(n);
                    }
                }
                continue;
            }
            if !name.is_empty() {
                out.push(std::mem::take(&mut name));
            }
        }
    }
    out
}

#[test]
fn the_layers_import_only_downwards() {
    for (rank, layer) in LAYERS.iter().enumerate() {
        let src = engine_file(layer);
        for used in uses(&src) {
            if let Some(r) = LAYERS.iter().position(|l| *l == used) {
                assert!(
                    r >= rank,
                    "engine/{layer}.rs uses engine/{used}.rs, a layer above it"
                );
            }
        }
    }
}

#[test]
fn only_commit_writes_to_the_store() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let mut writers = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        // The test modules of a file may write fixtures.
        let code = src.split("#[cfg(test)]").next().unwrap_or("");
        let writes = code.lines().any(|l| {
            let l = l.split("//").next().unwrap_or("");
            l.contains("store.write(") || l.contains("insert_new_task(")
        });
        if writes {
            writers.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert_eq!(
        writers,
        ["commit.rs"],
        "engine modules that write to the store"
    );
}

#[test]
fn the_checker_sees_imports() {
    // The parser above must find what it is meant to find, or the layer test proves nothing.
    let src = "use super::cells::{self, Locked};\nuse super::{alerts, plan, Inner};\n// super::dispatch\nlet x = super::arm::step(a);";
    assert_eq!(uses(src), ["cells", "alerts", "plan", "Inner", "arm"]);
    let step = uses(&engine_file("step"));
    assert!(step.contains(&"commit".to_string()), "{step:?}");
}

/// The `crate::` paths a file names outside `crate::model` (comments left out): `use
/// crate::x`, `crate::x::y(..)`, and the heads of `use crate::{a, b}` groups.
fn crate_paths_outside_model(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in src.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let heads: Vec<String> = if let Some(group) = rest.strip_prefix('{') {
                group
                    .split('}')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(|p| p.trim().to_string())
                    .collect()
            } else {
                vec![rest.to_string()]
            };
            for head in heads {
                let name: String = head
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != "model" {
                    out.push(name);
                }
            }
        }
    }
    out
}

#[test]
fn the_model_imports_nothing_above_it() {
    // model/ is the bottom layer (ARCHITECTURE.md): the data and its rules, named by every
    // other module and naming none of them.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/model");
    let mut found = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        files += 1;
        let src = std::fs::read_to_string(&path).unwrap();
        for used in crate_paths_outside_model(&src) {
            found.push(format!(
                "{}: crate::{used}",
                path.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    assert!(files >= 10, "read only {files} files of src/model");
    assert_eq!(
        found,
        Vec::<String>::new(),
        "src/model imports from above it"
    );
}

#[test]
fn the_model_checker_sees_imports() {
    let src = "use crate::schedule::quiet::QuietHours;\nuse crate::model::Task;\n// crate::api\nlet s = crate::schedule::format_utc(1);\nuse crate::{model::Lang, store, config::Config};";
    assert_eq!(
        crate_paths_outside_model(src),
        ["schedule", "schedule", "store", "config"]
    );
}
