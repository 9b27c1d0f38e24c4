//! README.md, the guides and the examples name the crate's items by the paths a user is meant
//! to use: the root's everyday names, the prelude, and the modules per audience. The old root
//! paths of the other names still build (hidden), so only this test notices a guide that
//! teaches one.

use std::path::{Path, PathBuf};

/// The modules of the crate a path may go through.
const MODULES: [&str; 12] = [
    "prelude",
    "tools",
    "runtime",
    "branch",
    "ledger",
    "audit",
    "store",
    "error",
    "testing",
    "metric",
    "fastrand",
    "__private",
];

/// The names `lib.rs` re-exports at the root as everyday names.
fn root_names() -> Vec<String> {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let start = lib
        .find("// The everyday names")
        .expect("lib.rs marks its everyday names");
    let end = lib.find("// The paths of the names above").expect("and where they end");
    let mut names = Vec::new();
    for stmt in lib[start..end].split(';') {
        let Some(at) = stmt.find("pub use ") else { continue };
        let body = &stmt[at + "pub use ".len()..];
        let list = match (body.find('{'), body.rfind('}')) {
            (Some(open), Some(close)) => body[open + 1..close].to_owned(),
            _ => body.rsplit("::").next().unwrap().to_owned(),
        };
        names.extend(list.split(',').map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()));
    }
    names
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

/// The names `text` reaches directly under `reactifact_core::`: `reactifact_core::Name` and
/// the items of `use reactifact_core::{..}`.
fn named_at_root(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    for (at, _) in text.match_indices("reactifact_core::") {
        let rest = &text[at + "reactifact_core::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(list.len())];
            for item in list.split(',') {
                let item = item.trim();
                if !item.contains("::") {
                    found.push(ident(item));
                }
            }
        } else {
            found.push(ident(rest));
        }
    }
    found.retain(|n| !n.is_empty() && n != "self");
    found
}

#[test]
fn guides_and_examples_use_the_root_the_prelude_and_the_audience_modules() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let root = root_names();
    assert!(
        (25..=35).contains(&root.len()),
        "the root has {} everyday names",
        root.len()
    );
    let mut sources = vec![workspace.join("README.md")];
    files(&workspace.join("docs"), "md", &mut sources);
    files(&workspace.join("reactifact-examples/src"), "rs", &mut sources);
    let mut hidden = Vec::new();
    for file in sources {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in named_at_root(&text) {
            if !root.contains(&name) && !MODULES.contains(&name.as_str()) {
                hidden.push(format!(
                    "{}: reactifact_core::{name}",
                    file.strip_prefix(workspace).unwrap().display()
                ));
            }
        }
    }
    assert!(hidden.is_empty(), "old root paths taught: {hidden:#?}");
}

#[test]
fn the_check_reads_paths_and_use_lists() {
    assert_eq!(
        named_at_root("use reactifact_core::{Context, store::OutboxStore, Runtime};"),
        ["Context", "Runtime"]
    );
    assert_eq!(
        named_at_root("reactifact_core::TurnOutcome::Completed"),
        ["TurnOutcome"]
    );
    assert!(root_names().contains(&"Context".to_owned()));
}
