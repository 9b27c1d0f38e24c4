//! The crate's folders are layers, and imports run downward only: `model/` ← `state/` ←
//! `store/` ← `session/` ← `outbox/` ← `run/` ← `audit/`. This test reads the sources and
//! fails on any `crate::` path from a file to a layer above its own.

use std::path::{Path, PathBuf};

const LAYERS: [&str; 7] = ["model", "state", "store", "session", "outbox", "run", "audit"];

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layers above `layer` that `source` names in a `crate::` path outside comments.
fn upward(source: &str, layer: usize) -> Vec<&'static str> {
    let mut found = Vec::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if let Some(target) = LAYERS.iter().position(|l| *l == name) {
                if target > layer && !found.contains(&LAYERS[target]) {
                    found.push(LAYERS[target]);
                }
            }
        }
    }
    found
}

#[test]
fn imports_run_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges = Vec::new();
    for (layer, name) in LAYERS.iter().enumerate() {
        let mut all = Vec::new();
        files(&src.join(name), &mut all);
        for file in all {
            let relative = file.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            for target in upward(&std::fs::read_to_string(&file).unwrap(), layer) {
                edges.push(format!("{relative} -> {target}/"));
            }
        }
    }
    assert!(edges.is_empty(), "imports that run upward: {edges:#?}");
}

#[test]
fn the_check_finds_an_upward_path() {
    assert_eq!(upward("use crate::run::runtime::Runtime;", 1), ["run"]);
    assert!(upward("// use crate::run::runtime::Runtime;", 1).is_empty());
    assert!(upward("use crate::model::artifact::Kind;", 1).is_empty());
}
